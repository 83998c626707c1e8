"""What the MCP gateway does with an agent's tool call, and the compensation it registers.

A tool is passed straight through when the configuration says it is read-only, or when it is
not mapped and its server marks it `readOnlyHint`; a mapped tool gets its UndoEntry before it
runs; an unmapped one is refused (or, under the `pass` policy, run and recorded as a step with
nothing to undo). The compensation's `${args.<path>}` are filled in from the call's arguments
as it is registered; `${output.<path>}` becomes `${steps.<step>.output.<path>}`, which the
operator fills in from the step's recorded result when it compensates.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from undolog.api import Call, Guard
from undolog.api.gateway import BeforeImage, GatewayConfig, ToolRule, Unmapped, webhook_of
from undolog.api.undo_entry import MAX_GUARD_VALUE_BYTES
from undolog.conventions import MAX_CALL_BYTES
from undolog.decisions import guard_expressions
from undolog.decisions.arguments import within
from undolog.decisions.expressions import ExpressionError
from undolog.decisions.undo_expressions import Filled, compile_expression, expressions_in, fill
from undolog.errors import ArgumentsTooLarge


@dataclass(frozen=True)
class PassThrough:
    """Read-only: called with no saga and no entry."""


@dataclass(frozen=True)
class Register:
    """A step, its entry written before the call; `rule` None for an unmapped tool under the
    `pass` or `confirm` policy; `confirm`: the user is asked first (it will not be undone, or
    `asked_by` a policy of that name)."""

    rule: ToolRule | None
    confirm: bool = False
    asked_by: str | None = None


@dataclass(frozen=True)
class Refuse:
    message: str


ToolDecision = PassThrough | Register | Refuse


def decide(config: GatewayConfig, tool: str, read_only_hint: bool, destructive_hint: bool = False) -> ToolDecision:
    """`tool` as <upstream>.<tool>; the hints as its server annotates it (the configuration
    wins over both)."""
    rule = config.tools.get(tool)
    if rule is not None:
        return PassThrough() if rule.read_only else Register(rule, confirm=rule.confirm)
    if read_only_hint and not destructive_hint:
        return PassThrough()
    if config.unmapped == Unmapped.PASS:
        return Register(None)
    if config.unmapped == Unmapped.CONFIRM:
        return Register(None, confirm=True)
    return Refuse(
        f"tool {tool} is not mapped: the UndoLog gateway runs only tools it can undo. Map it in the gateway's "
        f"configuration under tools.{tool}: either readOnly: true, or a compensation (tool: <upstream>.<tool> or "
        "function: <Webhook>, with args such as ${args.id} or ${output.id}), or confirm: true (the user is asked)"
    )


def compensation_call(rule: ToolRule, variables: Mapping[str, Any], step: str) -> tuple[Call, Filled]:
    """The Call registered for `step`, its expressions evaluated over `variables` (`args`, and
    `before` when the rule reads one) and those that read `output` deferred (Filled.deferred):
    ExpressionError or ArgumentsTooLarge naming what it cannot fill in, ValueError for
    arguments the ledger cannot carry."""
    assert rule.compensation is not None
    compensation = rule.compensation
    filled = fill(compensation.args, variables, step, defer_output=True)
    if not within(filled.value, MAX_CALL_BYTES):
        raise ArgumentsTooLarge(
            f"the compensation's arguments come to more than {MAX_CALL_BYTES} bytes: refer to an identifier, "
            "not a whole argument"
        )
    try:
        call = Call(function=compensation.webhook, version=compensation.version, args=filled.value)
    except ValidationError as invalid:
        problems = "; ".join(str(problem["msg"]) for problem in invalid.errors())
        raise ValueError(f"the compensation of step {step} cannot be registered: {problems}") from None
    return call, filled


def guard_of(rule: ToolRule, variables: Mapping[str, Any], step: str) -> Guard | None:
    """The guard registered for `step`: its read (arguments over `args`), its `holds`, and what
    that selected of the before-image when the guard reads the same tool (for a person)."""
    read, after = rule.guard_read, rule.after
    if read is None or after is None:
        return None
    args = fill(read.args, variables, step, defer_output=False).value
    given = dict(variables["args"]) if guard_expressions.reads_args(after.holds) else None
    before = None
    if after.tool is None and "before" in variables:
        try:
            before = guard_expressions.selected(after.holds, variables["before"], given)
        except ExpressionError:  # the state before lacks it (created by the step): nothing to show
            before = None
        before = before if within(before, MAX_GUARD_VALUE_BYTES) else None
    read_call = Call(function=webhook_of(read.tool), args=args)
    return Guard(read=read_call, holds=after.holds, args=given, before=before)


def read_arguments(read: BeforeImage, args: Mapping[str, Any]) -> dict[str, Any]:
    """A read's arguments (the before-image's, the guard's), over the call's `args`."""
    value = fill(read.args, {"args": args}, "", defer_output=False).value
    assert isinstance(value, dict)
    return value


def expression_problems(config: GatewayConfig) -> list[str]:
    """Every expression of the mappings that does not compile, or reads what its tool does not
    have (`before` without a before-image, `output` in a before-image's arguments)."""
    problems = []
    for tool, rule in config.tools.items():
        places: list[tuple[str, Any, frozenset[str]]] = []
        if rule.compensation is not None:
            readable = frozenset({"args", "output", *(("before",) if rule.before else ())})
            places.append((f"tools.{tool}.compensation.args", rule.compensation.args, readable))
        if rule.before is not None:
            places.append((f"tools.{tool}.before.args", rule.before.args, frozenset({"args"})))
        if rule.after is not None and rule.after.args is not None:
            places.append((f"tools.{tool}.after.args", rule.after.args, frozenset({"args"})))
        if rule.kubernetes is not None:
            named = rule.kubernetes.model_dump(exclude={"service_account"}, exclude_none=True)
            places.append((f"tools.{tool}.kubernetes", named, frozenset({"args"})))
        if rule.after is not None and rule.after.holds is not None:
            try:
                guard_expressions.check(rule.after.holds)
            except ExpressionError as error:
                problems.append(f"tools.{tool}.after.holds: {error}")
        for where, template, readable in places:
            for source in expressions_in(template):
                try:
                    compiled = compile_expression(source)
                except ExpressionError as error:
                    problems.append(f"{where}: {error}")
                    continue
                if not compiled.reads <= readable:
                    unreadable = ", ".join(sorted(compiled.reads - readable))
                    problems.append(f"{where}: ${{{source}}} reads {unreadable}, which it has not here")
    return problems
