"""The MCP gateway's undo expressions: `${...}` in a mapping's compensation (and before-image)
arguments are CEL (the Common Expression Language, Kubernetes' own; Google's bindings of
cel-cpp), over the call's `args`, its `output` and `before` (the state a read-only tool gave
before the call). A plain path (`${args.number}`) is CEL too. A string that is exactly one
expression takes its value (a list, an object...); one inside longer text is spliced in as text.

Each expression is compiled when the configuration loads (a syntax error refuses the start,
naming the tool and the expression), checked against the tools' schemas once their servers
list them (`unknown_fields`), evaluated over `args` and `before` when the step registers (a
failure refuses the call before it goes upstream), and, if it reads `output`, once the call's
result is back (`deferred`): its value is kept in the step's recorded output under
`undolog_undo`, where the compensation the operator calls refers to it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from undolog.decisions.expressions import Environment, ExpressionError

VARIABLES = ("args", "output", "before")
OUTPUT_PATH = re.compile(r"output(\.[A-Za-z_][A-Za-z0-9_]*)*")
_PATH = re.compile(r"(args|output|before)(\.[A-Za-z0-9_]+)*")
COMPUTED = "undolog_undo"  # the key of the recorded output that holds output-derived arguments
SKELETON_DEPTH = 16  # nesting a schema's skeleton follows (a recursive $ref stops there)
_READS = {name: re.compile(rf"(?<![\w.]){name}\b") for name in VARIABLES}
_ENV = Environment(VARIABLES)


@dataclass(frozen=True)
class Compiled:
    source: str
    program: Any  # cel.Expression
    reads: frozenset[str]  # which of args, output, before it reads


@lru_cache(maxsize=1024)  # each mapped call fills its templates: their expressions compiled once, at load
def compile_expression(source: str) -> Compiled:
    source = _indexed(source)
    program = _ENV.compile(source, f"${{{source}}}")
    return Compiled(source, program, frozenset(v for v, read in _READS.items() if read.search(source)))


def _indexed(source: str) -> str:
    """A path as the gateway first wrote them (`args.items.0.id`) in CEL's form (`args.items[0].id`)."""
    stripped = source.strip()
    if _PATH.fullmatch(stripped):
        return re.sub(r"\.(\d+)", r"[\1]", stripped)
    return source


def spans(text: str) -> list[tuple[int, int, str]]:
    """Each `${...}` in `text`: (start, end, the expression). Scanned, not matched by a pattern,
    because CEL has braces of its own (map literals) and in strings: the expression ends at the
    `}` that balances its `${`, outside quotes. An unclosed `${` is left as text."""
    found, at = [], text.find("${")
    while at != -1:
        end = _closing(text, at + 2)
        if end is None:
            break
        found.append((at, end + 1, text[at + 2 : end]))
        at = text.find("${", end + 1)
    return found


def _closing(text: str, start: int) -> int | None:
    depth, quote, i = 0, "", start
    while i < len(text):
        char = text[i]
        if quote:
            if char == "\\":
                i += 1
            elif char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char == "{":
            depth += 1
        elif char == "}":
            if depth == 0:
                return i
            depth -= 1
        i += 1
    return None


def expressions_in(value: Any) -> list[str]:
    """Every `${...}` in a JSON value, in document order."""
    if isinstance(value, str):
        return [source for _, _, source in spans(value)]
    if isinstance(value, Mapping):
        return [e for v in value.values() for e in expressions_in(v)]
    if isinstance(value, list):
        return [e for v in value for e in expressions_in(v)]
    return []


def evaluate(compiled: Compiled, variables: Mapping[str, Any]) -> Any:
    """Its value over `variables`; ExpressionError saying what failed."""
    return _ENV.evaluate(compiled.program, variables, f"${{{compiled.source}}}")


@dataclass
class Filled:
    """Arguments with what could be evaluated filled in; `deferred`: the expressions that read
    `output` (by their key under COMPUTED), and what refers to their values."""

    value: Any
    deferred: dict[str, Compiled] = field(default_factory=dict)


def fill(template: Any, variables: Mapping[str, Any], step: str, *, defer_output: bool) -> Filled:
    """The template with every expression evaluated over `variables`; one that reads `output`
    becomes `${steps.<step>.output.undolog_undo.<key>}` when `defer_output` (the operator fills
    it in from the value computed once the result is back)."""
    filled = Filled(None)
    filled.value = _fill(template, variables, step, filled, defer_output)
    return filled


def _fill(value: Any, variables: Mapping[str, Any], step: str, filled: Filled, defer: bool) -> Any:
    if isinstance(value, Mapping):
        return {k: _fill(v, variables, step, filled, defer) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, variables, step, filled, defer) for v in value]
    if not isinstance(value, str):
        return value
    found = spans(value)
    if len(found) == 1 and found[0][:2] == (0, len(value)):
        return _value(found[0][2], variables, step, filled, defer)
    text, done = [], 0
    for start, end, source in found:
        text += [value[done:start], _text(_value(source, variables, step, filled, defer))]
        done = end
    return "".join([*text, value[done:]])


def _value(source: str, variables: Mapping[str, Any], step: str, filled: Filled, defer: bool) -> Any:
    compiled = compile_expression(source)
    if defer and OUTPUT_PATH.fullmatch(source.strip()):  # a plain path: the operator follows it in the output
        return "${steps." + step + "." + source.strip() + "}"
    if "output" in compiled.reads and defer:
        key = f"e{len(filled.deferred)}"
        filled.deferred[key] = compiled
        return "${steps." + step + f".output.{COMPUTED}.{key}" + "}"
    return evaluate(compiled, variables)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def computed(deferred: Mapping[str, Compiled], variables: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The deferred expressions' values once the result is back, and what could not be computed."""
    values, failed = {}, []
    for key, compiled in deferred.items():
        try:
            values[key] = evaluate(compiled, variables)
        except ExpressionError as error:
            failed.append(str(error))
    return values, failed


# -- checked against the tools' schemas ----------------------------------------------------------------


def skeleton(schema: Any, defs: Mapping[str, Any] | None = None, depth: int = 0) -> Any:
    """A value of every field a JSON Schema declares (one item per list; `$ref`s into its
    `$defs` followed, to a bounded depth), to evaluate an expression against."""
    if not isinstance(schema, Mapping) or depth > SKELETON_DEPTH:
        return None
    defs = defs if defs is not None else {**schema.get("definitions", {}), **schema.get("$defs", {})}
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.rsplit("/", 1)[-1] in defs:
        return skeleton(defs[ref.rsplit("/", 1)[-1]], defs, depth + 1)
    for union in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(union), list) and schema[union]:
            chosen = next((s for s in schema[union] if s.get("type") != "null"), schema[union][0])
            return skeleton(chosen, defs, depth + 1)
    kind = schema.get("type")
    kind = next((k for k in kind if k != "null"), None) if isinstance(kind, list) else kind
    if kind == "object" or "properties" in schema:
        return {name: skeleton(sub, defs, depth + 1) for name, sub in (schema.get("properties") or {}).items()}
    if kind == "array":
        return [skeleton(schema.get("items"), defs, depth + 1)]
    return {"string": "text", "integer": 1, "number": 1.5, "boolean": True}.get(str(kind))


def unknown_fields(source: str, schemas: Mapping[str, Any]) -> str | None:
    """Why an expression names a field its variables' schemas (by variable, where the server
    gives one) do not declare; None when it fits, or when a variable it reads has no schema."""
    compiled = compile_expression(source)
    if not compiled.reads <= set(schemas):
        return None
    try:
        evaluate(compiled, {name: skeleton(schemas[name]) for name in compiled.reads})
    except ExpressionError as error:
        if "not found" in str(error).lower() or "no such" in str(error).lower():
            return f"${{{source}}} names a field its schema does not have ({error})"
    return None


JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
}


def mistyped(template: Mapping[str, Any], schemas: Mapping[str, Any], target: Mapping[str, Any]) -> list[str]:
    """The arguments of a call (`template`, constants and expressions over variables with
    `schemas`) whose value's JSON type the called tool's input schema (`target`) does not allow,
    each said as `<name>: ...`; an expression reading a variable without a schema is not judged."""
    properties = target.get("properties") if isinstance(target.get("properties"), Mapping) else {}
    problems = []
    for name, value in template.items():
        wanted = (properties or {}).get(name, {}).get("type") if isinstance(properties, Mapping) else None
        kinds = [wanted] if isinstance(wanted, str) else wanted if isinstance(wanted, list) else None
        if not kinds:
            continue
        given = _typical(value, schemas)
        if given is _UNKNOWN or given is None or any(_is(given, k) for k in kinds):
            continue
        shown = value if isinstance(value, str) else json.dumps(value)[:80]
        problems.append(f"{name}: {shown} gives {json_kind(given)}, where the tool's schema says {' or '.join(kinds)}")
    return problems


_UNKNOWN = object()


def _typical(value: Any, schemas: Mapping[str, Any]) -> Any:
    """A value of the type `value` fills in as: itself for a constant, its expression evaluated
    over its variables' skeletons, text for an expression spliced into text."""
    if not isinstance(value, str):
        return value
    found = spans(value)
    if not found:
        return value
    if len(found) > 1 or found[0][:2] != (0, len(value)):
        return "text"
    compiled = compile_expression(found[0][2])
    if not compiled.reads <= set(schemas):
        return _UNKNOWN
    try:
        return evaluate(compiled, {name: skeleton(schemas[name]) for name in compiled.reads})
    except ExpressionError:
        return _UNKNOWN


def json_kind(value: Any) -> str:
    """The JSON type of a value: string, integer, number, boolean, object, array or null."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    return next((kind for kind, types in JSON_TYPES.items() if isinstance(value, types)), type(value).__name__)


def _is(value: Any, kind: str) -> bool:
    if kind == "null":
        return value is None
    if isinstance(value, bool) and kind in ("integer", "number"):
        return False
    return isinstance(value, JSON_TYPES.get(kind, (object,)))
