"""Undo a server advertises in its tools' annotations (`compensations: fromAnnotations`), as
mappings: SEP-3172's `recovery` (a compensating operation of the same server, its parameters
OpenAPI runtime expressions over the call) and fastmcp's `x-compensation-pair` (the name of the
undoing tool alone). The configuration's own mapping of a tool wins over its annotation.

`x-compensation-pair` says nothing of arguments: each one the undoing tool requires is taken,
by its name, from the call's result where the tool's output schema declares it, else from the
call's arguments where its input schema does. One found in neither leaves the tool unmapped,
said why: nothing is guessed that would fail only when it is undone.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from undolog.api.gateway import GatewayConfig, ToolRule

RECOVERY = "recovery"
PAIR = "x-compensation-pair"
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_INDEX = re.compile(r"0|[1-9][0-9]*")  # RFC 6901's array index (no leading zeros)
# CEL's reserved words, which cannot follow a dot (a key named so is indexed instead).
_RESERVED = frozenset(
    [
        "as",
        "break",
        "const",
        "continue",
        "else",
        "false",
        "for",
        "function",
        "if",
        "import",
        "in",
        "let",
        "loop",
        "package",
        "namespace",
        "null",
        "return",
        "true",
        "var",
        "void",
        "while",
    ]
)
_SOURCES = {"$response.body": "output", "$request.body": "args"}


@dataclass(frozen=True)
class ListedTool:
    """What a server lists of one tool: its annotations as sent (unknown fields kept) and schemas."""

    name: str
    annotations: Mapping[str, Any]
    input_schema: Mapping[str, Any]
    output_schema: Mapping[str, Any] | None


@dataclass(frozen=True)
class Advertised:
    rule: ToolRule | None
    problem: str | None = None  # why the annotation could not be taken (rule None)


def advertised(upstream: str, tool: ListedTool, tools: Mapping[str, ListedTool]) -> Advertised | None:
    """The mapping `tool`'s annotations give (None when they advertise no undo)."""
    recovery, pair = tool.annotations.get(RECOVERY), tool.annotations.get(PAIR)
    try:
        if isinstance(recovery, Mapping):
            return Advertised(_from_recovery(upstream, recovery, tools))
        if isinstance(pair, str):
            return Advertised(_from_pair(upstream, tool, pair, tools))
    except ValueError as why:
        return Advertised(None, f"{upstream}.{tool.name}'s annotation {RECOVERY if recovery else PAIR}: {why}")
    return None


def _from_recovery(upstream: str, recovery: Mapping[str, Any], tools: Mapping[str, ListedTool]) -> ToolRule:
    if recovery.get("strategy") != "compensation":
        raise ValueError(f"strategy {recovery.get('strategy')!r} is not one the gateway knows (compensation)")
    operation = recovery.get("compensatingOperation")
    if not isinstance(operation, Mapping) or not isinstance(operation.get("operationId"), str):
        raise ValueError("compensatingOperation.operationId is missing")
    undo = _listed(operation["operationId"], tools)
    parameters = operation.get("parameters") or {}
    if not isinstance(parameters, Mapping):
        raise ValueError("compensatingOperation.parameters is not an object")
    args = {str(name): runtime_expression(value) for name, value in parameters.items()}
    return _rule(upstream, undo, args)


def _from_pair(upstream: str, tool: ListedTool, pair: str, tools: Mapping[str, ListedTool]) -> ToolRule:
    undo = _listed(pair, tools)
    args = {}
    for name in undo.input_schema.get("required") or []:
        if name in _properties(tool.output_schema):
            args[name] = "${" + _path("output", [name]) + "}"
        elif name in _properties(tool.input_schema):
            args[name] = "${" + _path("args", [name]) + "}"
        else:
            raise ValueError(
                f"{pair} requires {name!r}, which neither the call's output schema nor its arguments declare: "
                f"map tools.{upstream}.{tool.name} in the configuration"
            )
    return _rule(upstream, undo, args)


def _listed(name: str, tools: Mapping[str, ListedTool]) -> ListedTool:
    if name not in tools:
        raise ValueError(f"names {name!r}, which the same server does not list")
    return tools[name]


def _rule(upstream: str, undo: ListedTool, args: dict[str, Any]) -> ToolRule:
    try:
        return ToolRule.model_validate({"compensation": {"tool": f"{upstream}.{undo.name}", "args": args}})
    except ValidationError as invalid:
        raise ValueError("; ".join(str(e["msg"]) for e in invalid.errors())) from None


def _properties(schema: Mapping[str, Any] | None) -> Mapping[str, Any]:
    found = (schema or {}).get("properties")
    return found if isinstance(found, Mapping) else {}


def runtime_expression(value: Any) -> Any:
    """An OpenAPI runtime expression over the call as an undo expression: `$response.body#/a/0`
    is `${output.a[0]}`, `$request.body#/a` is `${args.a}`; a value that is not one (no `$`)
    is a constant. ValueError for a form the gateway cannot follow (headers, status, paths)."""
    if not isinstance(value, str) or not value.startswith("$"):
        return value
    source, _, pointer = value.partition("#")
    if source not in _SOURCES:
        raise ValueError(f"{value!r}: only $response.body#/... and $request.body#/... can be followed")
    if pointer and not pointer.startswith("/"):
        raise ValueError(f"{value!r}: the part after # is not a JSON pointer")
    segments = [s.replace("~1", "/").replace("~0", "~") for s in pointer.split("/")[1:]]
    return "${" + _path(_SOURCES[source], segments) + "}"


def _path(root: str, segments: list[str]) -> str:
    """CEL that follows `segments` as RFC 6901 does: `.name`, `["any key"]`, and a number as an
    index of a list or else a key of a map (which one is known only from the value)."""
    text = root
    for segment in segments:
        key = "[" + json.dumps(segment, ensure_ascii=False) + "]"
        if _INDEX.fullmatch(segment):
            text = f"(type({text}) == list ? {text}[{int(segment)}] : {text}{key})"
        elif _IDENTIFIER.fullmatch(segment) and segment not in _RESERVED:
            text += f".{segment}"
        else:
            text += key
    return text


def with_advertised(
    config: GatewayConfig, listed: Mapping[str, Mapping[str, ListedTool]]
) -> tuple[GatewayConfig, list[str]]:
    """The configuration with the mappings its servers advertise (`listed`: by upstream, by tool)
    for the tools it does not map itself, and a line for each taken or left."""
    tools, said = dict(config.tools), []
    for upstream, by_name in listed.items():
        for tool in by_name.values():
            qualified = f"{upstream}.{tool.name}"
            found = advertised(upstream, tool, by_name)
            if found is None:
                continue
            if qualified in config.tools:
                said.append(f"{qualified}: the configuration's mapping wins over its annotation")
            elif found.rule is None:
                said.append(f"{qualified} left unmapped: {found.problem}")
            else:
                tools[qualified] = found.rule
                assert found.rule.compensation is not None
                said.append(f"{qualified} undone by {found.rule.compensation.tool}, as its server advertises")
    merged = config.model_dump(by_alias=True)
    merged["tools"] = {name: rule.model_dump(by_alias=True) for name, rule in tools.items()}
    return GatewayConfig.model_validate(merged), said
