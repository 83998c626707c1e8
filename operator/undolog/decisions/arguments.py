"""Resolving `${steps.<name>.output.<path>}` references in a Call's args.

A string that is exactly one reference takes the referenced JSON value (object, number...);
a reference inside longer text is replaced by its text. Paths walk objects by key and lists
by index. Pure: outputs come in as data, errors name the reference.

The resolved arguments are bounded (MAX_CALL_BYTES): a saga of a few hundred KiB that names a
16 KiB output 50,000 times resolves to gigabytes, which the operator would hold, and its memory
limit end, at every restart. References resolved to a value share it, so the bound is checked
by a walk that stops once past it; text spliced into strings is counted as it is made.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from undolog.conventions import MAX_CALL_BYTES
from undolog.errors import ArgumentsTooLarge, UnresolvedReference

REFERENCE = re.compile(r"\$\{([^}]*)\}")
STEP_REFERENCE = re.compile(r"^steps\.([a-z0-9][-_a-z0-9]*)\.output(?:\.(.+))?$")


def references(value: Any) -> list[str]:
    """Every `${...}` expression in a JSON value, in document order."""
    if isinstance(value, str):
        return REFERENCE.findall(value)
    if isinstance(value, Mapping):
        return [r for v in value.values() for r in references(v)]
    if isinstance(value, list):
        return [r for v in value for r in references(v)]
    return []


def referenced_steps(value: Any) -> list[str]:
    """Names of the steps a value refers to (malformed references raise)."""
    steps = []
    for expression in references(value):
        match = STEP_REFERENCE.match(expression.strip())
        if not match:
            raise UnresolvedReference(
                f"${{{expression}}} is not a reference of the form ${{steps.<name>.output.<path>}}"
            )
        steps.append(match.group(1))
    return steps


def resolve(
    value: Any,
    outputs: Mapping[str, Mapping[str, Any] | None],
    *,
    missing_as_null: bool = False,
    limit: int = MAX_CALL_BYTES,
) -> Any:
    """`value` with every reference replaced from `outputs` (step name -> forward output); its
    JSON at most `limit` bytes (about: a character counts one), else ArgumentsTooLarge.

    A step present in `outputs` with output None never answered (say, a crash in flight); with
    `missing_as_null` its references become null, so a compensation still runs and the
    participant finds the effect by its Undolog-Forward-Key.
    """
    spliced = 0

    def splice(match: re.Match[str]) -> str:
        nonlocal spliced
        text = _text(_lookup(match.group(1), outputs, missing_as_null))
        spliced += len(text)
        if spliced > limit:
            raise _too_large(limit)
        return text

    def walk(value: Any) -> Any:
        if isinstance(value, str):
            whole = REFERENCE.fullmatch(value)
            if whole:
                return _lookup(whole.group(1), outputs, missing_as_null)
            return REFERENCE.sub(splice, value)
        if isinstance(value, Mapping):
            return {k: walk(v) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        return value

    resolved = walk(value)
    if not within(resolved, limit):
        raise _too_large(limit)
    return resolved


def within(value: Any, limit: int) -> bool:
    """Whether `value` as compact JSON is at most `limit` characters (escapes aside). Walks at
    most that much, however often one object is shared within it."""
    size, pending = 0, [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            size += len(item) + 2
        elif isinstance(item, Mapping):
            size += 1 + max(len(item), 1) + sum(len(key) + 3 for key in item)  # braces, commas; quotes, colon
            pending.extend(item.values())
        elif isinstance(item, list):
            size += 1 + max(len(item), 1)  # brackets, commas
            pending.extend(item)
        else:
            size += len(json.dumps(item))
        if size > limit:
            return False
    return True


def _too_large(limit: int) -> ArgumentsTooLarge:
    return ArgumentsTooLarge(
        f"the arguments, their ${{steps...}} references resolved, come to more than {limit} bytes, more than a "
        "participant is sent: pass an identifier the participant can look up instead of a whole output"
    )


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def _lookup(expression: str, outputs: Mapping[str, Mapping[str, Any] | None], missing_as_null: bool) -> Any:
    match = STEP_REFERENCE.match(expression.strip())
    if not match:
        raise UnresolvedReference(f"${{{expression}}} is not a reference of the form ${{steps.<name>.output.<path>}}")
    step, path = match.group(1), match.group(2)
    if step not in outputs:
        raise UnresolvedReference(f"${{{expression}}} refers to step {step!r}, which has not run before this call")
    current: Any = outputs[step]
    if current is None:
        if missing_as_null:
            return None
        raise UnresolvedReference(f"${{{expression}}}: step {step!r} returned no output")
    try:
        return follow(current, path)
    except LookupError as missing:
        raise UnresolvedReference(f"${{{expression}}}: the output of step {step!r} has no {missing}") from None


def follow(value: Any, path: str | None) -> Any:
    """The value at a dotted path: object keys, list indexes; LookupError naming the part missing."""
    for part in path.split(".") if path else []:
        if isinstance(value, Mapping) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isascii() and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            raise LookupError(repr(part))
    return value
