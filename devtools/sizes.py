"""How big the package's units are: the longest classes and functions, and those over the limits
the project keeps (a class does one job in at most 300 lines, a function fits a screen in 50).

    python -m devtools.sizes              # the ten longest of each
    python -m devtools.sizes --check      # exit 1 naming every unit over its limit

A function is measured from its first statement after the docstring to its end: a signature
that declares options (the CLI's, as typer wants them) is a table, not logic.
"""

from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "operator" / "undolog"
CLASS_LIMIT = 300
FUNCTION_LIMIT = 50


@dataclass(frozen=True)
class Unit:
    kind: str  # "class" or "function"
    name: str  # module:Qualified.name
    lines: int

    @property
    def limit(self) -> int:
        return CLASS_LIMIT if self.kind == "class" else FUNCTION_LIMIT


def body_lines(node: ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    body = node.body
    if len(body) > 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    start = node.lineno if isinstance(node, ast.ClassDef) else body[0].lineno
    return (node.end_lineno or start) - start + 1


def units_of(path: Path, root: Path) -> list[Unit]:
    module = path.relative_to(root.parent).with_suffix("").as_posix().replace("/", ".")
    found: list[Unit] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                kind = "class" if isinstance(child, ast.ClassDef) else "function"
                found.append(Unit(kind, f"{module}:{name}", body_lines(child)))
                visit(child, f"{name}.")

    visit(ast.parse(path.read_text(), str(path)), "")
    return found


def units(root: Path = PACKAGE) -> list[Unit]:
    return [unit for path in sorted(root.rglob("*.py")) for unit in units_of(path, root)]


def over_limits(root: Path = PACKAGE) -> list[Unit]:
    return [unit for unit in units(root) if unit.lines > unit.limit]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a unit is over its limit")
    parser.add_argument("--top", type=int, default=10, help="how many of each kind to print")
    parser.add_argument("root", nargs="?", type=Path, default=PACKAGE)
    arguments = parser.parse_args()
    if arguments.check:
        over = over_limits(arguments.root)
        for unit in over:
            print(f"{unit.name}: {unit.kind} of {unit.lines} lines (limit {unit.limit})")
        return 1 if over else 0
    found = units(arguments.root)
    for kind in ("class", "function"):
        longest = sorted((u for u in found if u.kind == kind), key=lambda u: -u.lines)[: arguments.top]
        print(f"longest {kind}es:" if kind == "class" else f"longest {kind}s:")
        for unit in longest:
            print(f"  {unit.lines:5d}  {unit.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
