"""kubectl's `-o jsonpath=TEMPLATE` and `-o custom-columns=SPEC` over what a command prints.

The expressions are JSONPath, read by jsonpath-ng; the template around them (text, `{"quoted
text"}`, `{range EXPR}...{end}`, expressions relative to the root or, inside a range, to its
item) is kubectl's own syntax, which no Python library reads: hand-written here, small.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from jsonpath_ng.exceptions import JSONPathError
from jsonpath_ng.ext.parser import parse

BRACED = re.compile(r'\{((?:[^{}"]|"(?:[^"\\]|\\.)*")*)\}')
RANGE = re.compile(r"^range\s+(.+)$")


class TemplateError(ValueError):
    """A template or column spec that cannot be read, said as kubectl says it."""


@dataclass
class _Node:
    text: str | None = None  # literal text
    expression: str | None = None  # an expression whose values are printed
    each: str | None = None  # {range EXPR}: its children once per value
    children: list[_Node] = field(default_factory=list)


def _query(expression: str) -> Any:
    text = expression.strip()
    path = "$" if text in ("", "@", "$") else text if text.startswith("$") else f"${text}"
    try:
        return parse(path.replace("$@", "$"))
    except JSONPathError as error:
        raise TemplateError(f"{expression!r} is not a JSONPath expression: {error}") from None


def values(expression: str, data: Any) -> list[Any]:
    return [match.value for match in _query(expression).find(data)]


def shown(value: Any) -> str:
    """A value as kubectl prints it: text as it is, anything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def _parsed(template: str) -> list[_Node]:
    top: list[_Node] = []
    stack = [top]
    at = 0
    for match in BRACED.finditer(template):
        if match.start() > at:
            stack[-1].append(_Node(text=template[at : match.start()]))
        inside = match.group(1).strip()
        at = match.end()
        if looping := RANGE.match(inside):
            node = _Node(each=looping.group(1))
            stack[-1].append(node)
            stack.append(node.children)
        elif inside == "end":
            if len(stack) == 1:
                raise TemplateError(f"{template!r}: {{end}} without {{range}}")
            stack.pop()
        elif inside.startswith('"') and inside.endswith('"'):
            stack[-1].append(_Node(text=json.loads(inside)))
        else:
            _query(inside)  # refused now, before anything is printed
            stack[-1].append(_Node(expression=inside))
    if len(stack) > 1:
        raise TemplateError(f"{template!r}: {{range}} without {{end}}")
    if at < len(template):
        top.append(_Node(text=template[at:]))
    return top


def _printed(nodes: list[_Node], data: Any) -> str:
    out = []
    for node in nodes:
        if node.text is not None:
            out.append(node.text)
        elif node.expression is not None:
            out.append(" ".join(shown(v) for v in values(node.expression, data)))
        elif node.each is not None:
            out.extend(_printed(node.children, item) for item in values(node.each, data))
    return "".join(out)


def jsonpath(template: str, document: Any) -> str:
    """The template filled in from `document` (a List, or one object)."""
    return _printed(_parsed(template), document)


def custom_columns(spec: str, items: list[Any], headers: bool = True) -> list[list[str]]:
    """Rows (the header first, unless not `headers`) of `NAME:EXPR,...` over each item; a value
    that is missing is <none>, several are joined by commas, as kubectl prints them."""
    columns = []
    for column in spec.split(","):
        name, colon, expression = column.partition(":")
        if not colon or not name or not expression.strip():
            raise TemplateError(f"custom-columns {column!r} is not NAME:EXPRESSION (e.g. NAME:.metadata.name)")
        expression = expression.strip().removeprefix("{").removesuffix("}")
        _query(expression)
        columns.append((name, expression))
    rows = [[name for name, _ in columns]] if headers else []
    for item in items:
        rows.append([",".join(shown(v) for v in values(e, item)) or "<none>" for _, e in columns])
    return rows
