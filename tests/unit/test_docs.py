"""Docs that run as written: every `undolog ...` command shown in README and docs/ is accepted
by the CLI as it is today (subcommand, options, arguments), so the docs cannot drift from it.
What the commands do is covered by the cluster tests (tests/cluster/test_cli.py and others)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import typer
from typer.core import TyperGroup

from undolog.cli.app import app

REPO = Path(__file__).resolve().parents[2]
DOCS = [
    REPO / "README.md",
    *sorted((REPO / "docs").glob("*.md")),
    REPO / "charts" / "undolog" / "templates" / "NOTES.txt",
]
COMMAND = re.compile(r"^\s*(?:\$ )?(?:kubectl )?(undolog [^#`\n]*)", re.MULTILINE)


def documented() -> list[tuple[str, str]]:
    found = []
    for path in DOCS:
        for match in COMMAND.finditer(path.read_text()):
            line = match.group(1).strip()
            if "{{" in line or "<" in line:  # a template or a placeholder, not a runnable line
                continue
            found.append((path.name, line))
    return found


def test_the_docs_show_commands() -> None:
    assert len(documented()) >= 15


@pytest.mark.parametrize(("where", "line"), documented())
def test_a_documented_command_is_accepted(where: str, line: str) -> None:
    root = typer.main.get_command(app)
    assert isinstance(root, TyperGroup)
    name, *args = shlex.split(line)[1:]
    context = root.context_class(root, info_name="undolog")
    command = root.get_command(context, name)
    assert command is not None, f"{where}: no command {name!r} in {line!r}"
    command.make_context(name, args, parent=context)  # raises on a stale option or a missing argument
