"""A mapped tool call as a step of its saga, in both protocol eras: its before-image read first
(if the mapping has one), its UndoEntry registered with the compensation filled in, the call
sent upstream under the step's Idempotency-Key, and its result recorded on the entry."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

import mcp_types as types

from undolog.api import EntryTask, GuardStatus
from undolog.api.gateway import BeforeImage, ToolRule
from undolog.calls.mcp import answered, result_value
from undolog.conventions import repeated_step, step_name_of
from undolog.decisions import guard_expressions, guards
from undolog.decisions.arguments import within
from undolog.decisions.tool_calls import compensation_call, guard_of, read_arguments
from undolog.decisions.undo_expressions import COMPUTED, Filled, computed
from undolog.errors import TaskAbandoned, UndoLogError
from undolog.gateway.agent_requests import AgentRequest
from undolog.gateway.catalogue import ToolCatalogue, UpstreamTool
from undolog.gateway.object_steps import ObjectStep, ObjectSteps
from undolog.gateway.task_wire import TaskCreated
from undolog.gateway.tasks import handed
from undolog.gateway.upstreams import Answer, Rounds, Upstreams
from undolog.inspect import Inspector, PlannedCompensation
from undolog.kube import Kube
from undolog.sdk import SagaRun
from undolog.sdk.saga import StepRun, unrecorded_step

log = logging.getLogger("undolog.gateway")
MAX_BEFORE_BYTES = 256 * 1024  # of a before-image: it goes into the compensation's arguments
SAGA_META = "io.undolog/saga"
STEP_META = "io.undolog/step"


class NotCalled(UndoLogError):
    """The step could not be registered: nothing was sent upstream."""


class BeforeImageFailed(UndoLogError):
    """The mapping's before-image could not be read: the call is not sent."""


class ToolFailed(UndoLogError):
    """The upstream answered the call with isError: a failed step, still compensated."""


@dataclass(frozen=True)
class ToolCall:
    """An agent's call of a mapped tool: who asks, the tool, its arguments (without the saga
    handle), its mapping (None: unmapped, recorded with nothing to undo), and, on the stateless
    revision, the rounds of a server's questions it answers."""

    request: AgentRequest
    tool: UpstreamTool
    arguments: dict[str, Any]
    rule: ToolRule | None
    rounds: Rounds | None = None


@dataclass(frozen=True)
class Registered:
    """A step as registered: its entry's run, its compensation's deferred expressions, and the
    Kubernetes object it changes (read again right after the call)."""

    run: StepRun
    filled: Filled | None
    changing: ObjectStep | None


class Steps:
    def __init__(self, upstreams: Upstreams, catalogue: ToolCatalogue, objects: ObjectSteps, key: bytes) -> None:
        self.upstreams, self.catalogue, self.objects = upstreams, catalogue, objects
        self.key = key  # signs the tasks it hands agents (tasks.py)

    async def call(self, call: ToolCall, run: SagaRun, position: int, meta: dict[str, Any], carried: bool) -> Answer:
        """Register the step `<tool>-<position>` (its compensation filled in from the arguments
        and the before-image), call upstream, record the result (`meta` added to what the agent
        gets). `carried`: the retry of a call whose server asked for input first, recorded on the
        step registered for it, which is still open, under the same Idempotency-Key."""
        step = repeated_step(step_name_of(call.tool.tool.name), position)
        rule = call.rule
        try:
            variables = await self._variables(call)
            compensation, filled = (
                compensation_call(rule, variables, step) if rule and rule.compensation else (None, None)
            )
            guard = guard_of(rule, variables, step) if rule else None
            changing = await self._object(call, run)
            registered = (
                await unrecorded_step(run, position)
                if carried
                else await run.register(step, compensation, guard=guard, kubernetes=changing.undo if changing else None)
            )
        except (ValueError, UndoLogError) as error:
            raise NotCalled(f"tool {call.tool.qualified} was not called: {error}") from error
        return await self._recorded(call, run, Registered(registered, filled, changing), variables, meta)

    async def _object(self, call: ToolCall, run: SagaRun) -> ObjectStep | None:
        """The Kubernetes object the call changes, read before it (its mapping's `kubernetes`)."""
        if call.rule is None or call.rule.kubernetes is None:
            return None
        return await self.objects.before(call.rule.kubernetes, call.arguments, run.namespace, call.request.principal)

    async def _variables(self, call: ToolCall) -> dict[str, Any]:
        variables: dict[str, Any] = {"args": call.arguments}
        if call.rule is not None and call.rule.before is not None:
            variables["before"] = await self.read_before(call.request, call.rule, call.arguments)
        return variables

    async def _recorded(
        self, call: ToolCall, run: SagaRun, step: Registered, variables: dict[str, Any], meta: dict[str, Any]
    ) -> Answer:
        """Call upstream and record the result: an isError result or an exception is a failed
        step (its effect may be partial, so it is compensated), its output kept with what the
        compensation computes from it. An `input_required` answer records nothing: the step stays
        open (compensated, if the saga ends before the retry records it)."""
        tool, registered, filled = call.tool, step.run, step.filled
        try:
            result = await self.upstreams.call(call.request, tool, call.arguments, registered.forward_key, call.rounds)
        except Exception as error:
            await run.finish(registered, error)
            raise
        said = {SAGA_META: f"{run.namespace}/{run.name}", STEP_META: registered.name, **meta}
        if isinstance(result, types.InputRequiredResult):
            await registered.marked()  # its in-flight mark landed or never will: the retry's write is not raced
            return types.InputRequiredResult(
                input_requests=result.input_requests,
                request_state=result.request_state,
                meta={**(result.meta or {}), **said},
            )
        if isinstance(result, TaskCreated):  # open until the task ends (tasks.py)
            await registered.running_as_task(EntryTask(upstream=tool.upstream, task_id=result.task_id))
            task = handed(self.key, call.request, tool.upstream, result, (run, registered.position))
            task.meta = {**(result.meta or {}), **said}
            return task
        outcome = answered(tool.tool.name, 200, result)
        registered.output = with_computed(outcome.output, filled, {**variables, "output": result_value(result)})
        rule = call.rule
        if rule is not None and rule.after is not None and rule.guard_read is not None:
            registered.left = await self.read_after(call.request, rule.guard_read, rule.after.holds, call.arguments)
        if step.changing is not None:
            registered.left = await step.changing.left()
        await run.finish(registered, ToolFailed(outcome.error) if outcome.error else None)
        return types.CallToolResult(
            content=result.content,
            structured_content=result.structured_content,
            is_error=result.is_error,
            meta={**(result.meta or {}), **said},
        )

    async def task_ended(self, run: SagaRun, step: StepRun, said: dict[str, Any]) -> None:
        """The outcome of a step whose task ended (tasks/get's answer): completed, as a result
        answered at once (without what its compensation would compute from the output: the
        call's arguments are not kept); cancelled or failed, nothing done by the server's word."""
        status = said.get("status")
        if status == "completed":
            result = types.CallToolResult.model_validate(said.get("result") or {"content": []})
            outcome = answered(step.name, 200, result)
            step.output = outcome.output
            await run.finish(step, ToolFailed(outcome.error) if outcome.error else None)
            return
        error = said.get("error") if isinstance(said.get("error"), dict) else {}
        why = f"its task ended {status}" + (f": {error.get('message')}" if error and error.get("message") else "")
        await run.finish(step, TaskAbandoned(why))

    async def _read(self, request: AgentRequest, read: BeforeImage, arguments: dict[str, Any]) -> Any:
        """A read-only tool's result as expressions read it; ReadFailed when it answers isError."""
        reader = self.catalogue.qualified(read.tool)
        result = await self.upstreams.call(request, reader, read_arguments(read, arguments), None)
        if result.is_error:
            said = " ".join(b.text for b in result.content if isinstance(b, types.TextContent)) or "no text"
            raise ReadFailed(f"{read.tool}: {said[:300]}")
        return result_value(result)

    async def read_after(
        self, request: AgentRequest, read: BeforeImage, holds: str | None, arguments: dict[str, Any]
    ) -> GuardStatus | None:
        """What the step left, read right after it for its guard. Unread (None: the read failed,
        or `holds` cannot select from it), the undo halts as Conflict for a person to decide."""
        try:
            return guards.left(guard_expressions.selected(holds, await self._read(request, read, arguments), arguments))
        except Exception as error:  # the call is made: its undo halts for a person instead
            log.warning("what a step left could not be read for its guard (%s): %s", read.tool, error)
            return None

    async def read_before(self, request: AgentRequest, rule: ToolRule, arguments: dict[str, Any]) -> Any:
        """The state before the call, as the mapping's read-only tool gives it; BeforeImageFailed
        (nothing is called) when it cannot be read or is more than UndoLog keeps."""
        assert rule.before is not None
        try:
            value = await self._read(request, rule.before, arguments)
        except ReadFailed as failed:
            raise BeforeImageFailed(f"the state before it could not be read ({failed})") from None
        if not within(value, MAX_BEFORE_BYTES):
            raise BeforeImageFailed(
                f"the state before it ({rule.before.tool}) is more than the {MAX_BEFORE_BYTES} bytes UndoLog keeps"
            )
        return value


class ReadFailed(UndoLogError):
    """A read-only tool answered isError."""


def with_computed(output: dict[str, Any] | None, filled: Filled | None, variables: dict[str, Any]) -> Any:
    """The step's output to record, with what its compensation computes from the result."""
    if filled is None or not filled.deferred:
        return output
    values, failed = computed(filled.deferred, variables)
    said: dict[str, Any] = {COMPUTED: values}
    if failed:  # the compensation reads null there: a person sees why on the step
        said[f"{COMPUTED}_failed"] = failed
    return {**(output or {}), **said}


async def plan_text(kube: Kube, run: SagaRun) -> str:
    """What an abort of the saga would undo, in order, said for the agent."""
    plan = await Inspector(kube).plan(run.namespace, run.name)
    return "; ".join(planned(p) for p in plan.steps) or "nothing"


def planned(compensation: PlannedCompensation) -> str:
    spec = compensation.entry.spec
    said = (
        f"{compensation.order}. {spec.step} → {spec.compensation.function if spec.compensation else spec.undone_with}"
    )
    if compensation.args is not None:
        said += f" {json.dumps(compensation.args)}"
    return said + (f" ({compensation.refusal})" if compensation.refusal else "")
