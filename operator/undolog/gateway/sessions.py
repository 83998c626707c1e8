"""Sessions are sagas: an agent's MCP session gets a saga with its first mapped tool call, each
such call an UndoEntry written before the call goes upstream, and the saga ends with the
agent's `undolog_commit` or `undolog_abort`, or, when the session ends without either, as the
configuration says (`onClose`: abort by default)."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import mcp_types as types

from undolog.api.gateway import GatewayConfig, OnClose, ToolRule
from undolog.calls.mcp import answered
from undolog.conventions import repeated_step, step_name_of
from undolog.decisions.arguments import within
from undolog.decisions.tool_calls import before_arguments, compensation_call
from undolog.decisions.undo_expressions import COMPUTED, Filled, computed
from undolog.errors import UndoLogError
from undolog.gateway.upstreams import Rounds, Upstreams, UpstreamTool
from undolog.inspect import Inspector, PlannedCompensation
from undolog.kube import Kube
from undolog.sdk import SagaRun, open_saga
from undolog.sdk.saga import StepRun, unrecorded_step

MAX_BEFORE_BYTES = 256 * 1024  # of a before-image: it goes into the compensation's arguments
SAGA_META = "io.undolog/saga"
STEP_META = "io.undolog/step"


class NotCalled(UndoLogError):
    """The step could not be registered: nothing was sent upstream."""


class BeforeImageFailed(UndoLogError):
    """The mapping's before-image could not be read: the call is not sent."""


class ToolFailed(UndoLogError):
    """The upstream answered the call with isError: a failed step, still compensated."""


@dataclass
class SessionSaga:
    """One session's saga, opened with its first step."""

    config: GatewayConfig
    kube: Kube
    upstreams: Upstreams
    run: SagaRun | None = None
    steps: int = 0  # names steps uniquely within the saga: <tool>-<n>
    last_seen: float = field(default_factory=time.monotonic)
    _opening: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def saga(self) -> SagaRun:
        async with self._opening:
            if self.run is None:
                self.run = await open_saga(
                    generate_name="mcp-",
                    namespace=self.config.namespace,
                    org=self.config.org,
                    deadline_seconds=self.config.deadline_seconds,
                    kube=self.kube,
                )
                self.steps = 0
            return self.run

    async def call(
        self, tool: UpstreamTool, arguments: dict[str, Any], rule: ToolRule | None
    ) -> types.CallToolResult | types.InputRequiredResult:
        """The call as the session saga's next step (see `call_as_step`)."""
        try:
            run = await self.saga()
        except (ValueError, UndoLogError) as error:
            raise NotCalled(f"tool {tool.qualified} was not called: {error}") from error
        self.steps += 1
        return await call_as_step(run, self.upstreams, tool, arguments, rule, self.steps)

    async def end(self, outcome: OnClose, reason: str) -> str:
        """Commit or abort the open saga; what was done, said for the agent."""
        run, self.run = self.run, None
        if run is None:
            return "no saga is open in this session: nothing to commit or abort"
        if outcome == OnClose.COMMIT:
            await run.commit()
            return f"saga {run.namespace}/{run.name} committed: its steps stay done"
        plan = await self.plan_of(run)
        await run.abort(reason)
        return f"saga {run.namespace}/{run.name} aborted ({reason}); the operator undoes, newest first: {plan}"

    async def rewind(self, to_step: str, reason: str) -> str:
        run = await self.saga()
        await run.rewind_to(int(to_step) if to_step.isdigit() else to_step, reason)
        return f"saga {run.namespace}/{run.name} rewound to {to_step}: the steps after it are undone; carry on"

    async def status(self) -> str:
        if self.run is None:
            return "no saga is open in this session: no step has run that could be undone"
        return (
            f"saga {self.run.namespace}/{self.run.name}; undone on abort, newest first: {await self.plan_of(self.run)}"
        )

    async def plan_of(self, run: SagaRun) -> str:
        return await plan_text(self.kube, run)


async def plan_text(kube: Kube, run: SagaRun) -> str:
    """What an abort of the saga would undo, in order, said for the agent."""
    plan = await Inspector(kube).plan(run.namespace, run.name)
    return "; ".join(planned(p) for p in plan.steps) or "nothing"


async def call_as_step(
    run: SagaRun,
    upstreams: Upstreams,
    tool: UpstreamTool,
    arguments: dict[str, Any],
    rule: ToolRule | None,
    position: int,
    meta: dict[str, Any] | None = None,
    rounds: Rounds | None = None,
    carried: bool = False,
) -> types.CallToolResult | types.InputRequiredResult:
    """Register the step `<tool>-<position>` (its before-image read first, if the mapping has
    one; its compensation filled in from the arguments and that), call upstream, record the
    result (see `recorded_call`). `carried`: the retry of a call whose server asked for input
    first, recorded on the step registered for it, which is still open, under the same
    Idempotency-Key."""
    step = repeated_step(step_name_of(tool.tool.name), position)
    try:
        variables = await _variables(upstreams, rule, arguments)
        compensation, filled = compensation_call(rule, variables, step) if rule and rule.compensation else (None, None)
        registered = await unrecorded_step(run, position) if carried else await run.register(step, compensation)
    except (ValueError, UndoLogError) as error:
        raise NotCalled(f"tool {tool.qualified} was not called: {error}") from error
    return await recorded_call(run, upstreams, tool, arguments, registered, filled, variables, meta, rounds)


async def _variables(upstreams: Upstreams, rule: ToolRule | None, arguments: dict[str, Any]) -> dict[str, Any]:
    variables: dict[str, Any] = {"args": arguments}
    if rule is not None and rule.before is not None:
        variables["before"] = await read_before(upstreams, rule, arguments)
    return variables


async def recorded_call(
    run: SagaRun,
    upstreams: Upstreams,
    tool: UpstreamTool,
    arguments: dict[str, Any],
    registered: StepRun,
    filled: Filled | None,
    variables: dict[str, Any],
    meta: dict[str, Any] | None,
    rounds: Rounds | None,
) -> types.CallToolResult | types.InputRequiredResult:
    """Call upstream and record the result: an isError result or an exception is a failed step
    (its effect may be partial, so it is compensated), its output kept with what the
    compensation computes from it. An `input_required` answer records nothing: the step stays
    open (compensated, if the saga ends before the retry records it)."""
    try:
        result = await upstreams.call(tool, arguments, registered.forward_key, rounds)
    except Exception as error:
        await run.finish(registered, error)
        raise
    said = {SAGA_META: f"{run.namespace}/{run.name}", STEP_META: registered.name, **(meta or {})}
    if isinstance(result, types.InputRequiredResult):
        await registered.marked()  # its in-flight mark landed or never will: the retry's write is not raced
        return types.InputRequiredResult(
            input_requests=result.input_requests,
            request_state=result.request_state,
            meta={**(result.meta or {}), **said},
        )
    outcome = answered(tool.tool.name, 200, result)
    registered.output = with_computed(outcome.output, filled, {**variables, "output": result_value(result)})
    await run.finish(registered, ToolFailed(outcome.error) if outcome.error else None)
    return types.CallToolResult(
        content=result.content,
        structured_content=result.structured_content,
        is_error=result.is_error,
        meta={**(result.meta or {}), **said},
    )


async def read_before(upstreams: Upstreams, rule: ToolRule, arguments: dict[str, Any]) -> Any:
    """The state before the call, as the mapping's read-only tool gives it; BeforeImageFailed
    (nothing is called) when it cannot be read or is more than UndoLog keeps."""
    assert rule.before is not None
    reader = upstreams.qualified(rule.before.tool)
    result = await upstreams.call(reader, before_arguments(rule, arguments), None)
    if result.is_error:
        said = " ".join(b.text for b in result.content if isinstance(b, types.TextContent)) or "no text"
        raise BeforeImageFailed(f"the state before it could not be read ({rule.before.tool}: {said[:300]})")
    value = result_value(result)
    if not within(value, MAX_BEFORE_BYTES):
        raise BeforeImageFailed(
            f"the state before it ({rule.before.tool}) is more than the {MAX_BEFORE_BYTES} bytes UndoLog keeps"
        )
    return value


def result_value(result: types.CallToolResult) -> Any:
    """A tool's result as an expression reads it: its structuredContent, else its lone text as
    JSON, else its text (`{"text": ...}`)."""
    if result.structured_content is not None:
        return result.structured_content
    texts = [b.text for b in result.content if isinstance(b, types.TextContent)]
    if len(texts) == 1:
        try:
            return json.loads(texts[0])
        except ValueError:
            pass
    return {"text": "\n".join(texts)} if texts else None


def with_computed(output: dict[str, Any] | None, filled: Filled | None, variables: dict[str, Any]) -> Any:
    """The step's output to record, with what its compensation computes from the result."""
    if filled is None or not filled.deferred:
        return output
    values, failed = computed(filled.deferred, variables)
    said: dict[str, Any] = {COMPUTED: values}
    if failed:  # the compensation reads null there: a person sees why on the step
        said[f"{COMPUTED}_failed"] = failed
    return {**(output or {}), **said}


def planned(compensation: PlannedCompensation) -> str:
    call = compensation.entry.spec.compensation
    said = f"{compensation.order}. {compensation.entry.spec.step} → {call.function if call else '-'}"
    if compensation.args is not None:
        said += f" {json.dumps(compensation.args)}"
    return said + (f" ({compensation.refusal})" if compensation.refusal else "")
