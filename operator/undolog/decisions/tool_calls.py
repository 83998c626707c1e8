"""What the MCP gateway does with an agent's tool call, and the compensation it registers.

A tool is passed straight through when the configuration says it is read-only, or when it is
not mapped and its server marks it `readOnlyHint`; a mapped tool gets its UndoEntry before it
runs; an unmapped one is refused (or, under the `pass` policy, run and recorded as a step with
nothing to undo). The compensation's `${args.<path>}` are filled in from the call's arguments
as it is registered; `${output.<path>}` becomes `${steps.<step>.output.<path>}`, which the
operator fills in from the step's recorded result when it compensates.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from undolog.api import Call
from undolog.api.gateway import GatewayConfig, ToolRule, Unmapped
from undolog.conventions import MAX_CALL_BYTES
from undolog.decisions.arguments import REFERENCE, follow, within
from undolog.errors import ArgumentsTooLarge, UnresolvedReference


@dataclass(frozen=True)
class PassThrough:
    """Read-only: called with no saga and no entry."""


@dataclass(frozen=True)
class Register:
    """A step, its entry written before the call; `compensation` None under the `pass` policy."""

    rule: ToolRule | None


@dataclass(frozen=True)
class Refuse:
    message: str


ToolDecision = PassThrough | Register | Refuse


def decide(config: GatewayConfig, tool: str, read_only_hint: bool) -> ToolDecision:
    """`tool` as <upstream>.<tool>; `read_only_hint` as its server annotates it."""
    rule = config.tools.get(tool)
    if rule is not None:
        return PassThrough() if rule.read_only else Register(rule)
    if read_only_hint:
        return PassThrough()
    if config.unmapped == Unmapped.PASS:
        return Register(None)
    return Refuse(
        f"tool {tool} is not mapped: the UndoLog gateway runs only tools it can undo. Map it in the gateway's "
        f"configuration under tools.{tool}: either readOnly: true, or a compensation (tool: <upstream>.<tool> or "
        "function: <Webhook>, with args such as ${args.id} or ${output.id})"
    )


def compensation_call(rule: ToolRule, args: Mapping[str, Any], step: str) -> Call:
    """The Call registered for `step`: UnresolvedReference naming what it cannot fill in,
    ValueError for arguments the ledger cannot carry."""
    assert rule.compensation is not None
    compensation = rule.compensation
    filled = _filled(compensation.args, args, step)
    if not within(filled, MAX_CALL_BYTES):
        raise ArgumentsTooLarge(
            f"the compensation's arguments come to more than {MAX_CALL_BYTES} bytes: refer to an identifier, "
            "not a whole argument"
        )
    try:
        return Call(function=compensation.webhook, version=compensation.version, args=filled)
    except ValidationError as invalid:
        problems = "; ".join(str(problem["msg"]) for problem in invalid.errors())
        raise ValueError(f"the compensation of step {step} cannot be registered: {problems}") from None


def _filled(value: Any, args: Mapping[str, Any], step: str) -> Any:
    if isinstance(value, str):
        whole = REFERENCE.fullmatch(value)
        if whole and not _is_output(whole.group(1)):
            return _argument(whole.group(1), args)
        return REFERENCE.sub(lambda match: _spliced(match.group(1), args, step), value)
    if isinstance(value, Mapping):
        return {key: _filled(item, args, step) for key, item in value.items()}
    if isinstance(value, list):
        return [_filled(item, args, step) for item in value]
    return value


def _is_output(expression: str) -> bool:
    return re.fullmatch(r"output(\..+)?", expression.strip()) is not None


def _spliced(expression: str, args: Mapping[str, Any], step: str) -> str:
    if _is_output(expression):
        return "${steps." + step + "." + expression.strip() + "}"
    value = _argument(expression, args)
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def _argument(expression: str, args: Mapping[str, Any]) -> Any:
    path = expression.strip()
    if not re.fullmatch(r"args(\..+)?", path):
        raise UnresolvedReference(f"${{{expression}}} is neither ${{args.<path>}} nor ${{output.<path>}}")
    try:
        return follow(args, path.partition(".")[2] or None)
    except LookupError as missing:
        raise UnresolvedReference(f"${{{expression}}}: the call's arguments have no {missing}") from None
