"""One entry's call with its retries, each failed attempt written to the entry (and posted as
an Event) before the next starts. Shared by forward calls and compensations.

The entry is marked in flight (Executing / Running) only when the call is not over within
IN_FLIGHT_MARK_AFTER of leaving: the mark is for people watching, and a call queued behind the
operator's own (a participant's slots all taken) is not yet at the participant. After a crash, Pending and in-flight
entries alike are sent again under the same Idempotency-Key.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from undolog import metrics
from undolog.api import Attempt, AttemptKind, Backoff, Call, EntryReason, EventReason, Saga, UndoEntry
from undolog.api.changes import EntryStatusChange, changed
from undolog.api.undo_entry import MAX_ATTEMPTS
from undolog.calls import protocol
from undolog.calls.registry import Registry
from undolog.calls.runner import AttemptRecord, CallResult, CallTrace, Runner
from undolog.calls.transport import Target
from undolog.controller.timeline import Timeline
from undolog.conventions import IN_FLIGHT_MARK_AFTER, clip
from undolog.decisions.arguments import resolve
from undolog.decisions.retry import Verdict
from undolog.errors import CallNotPossible, KubeError
from undolog.ledger import Ledger
from undolog.tracing import TRACEPARENT_ANNOTATION

log = logging.getLogger("undolog.calls")
Changes = EntryStatusChange


def attempt_of(record: AttemptRecord, kind: AttemptKind) -> Attempt:
    return Attempt(
        kind=kind,
        time=record.started_at,
        number=record.number,
        status_code=record.outcome.status_code,
        error=record.error[:1024] if record.error else None,
        duration_milliseconds=record.duration_milliseconds,
    )


@dataclass(frozen=True)
class CallPlan:
    """How one entry's call is made and recorded: data only (compensation.py and forward.py
    write theirs); the recorder fills in the arguments and the target once they are known."""

    kind: AttemptKind
    label: str  # "<entry> (step <step>, <function> <version>)" in Events
    call: Call
    key: str  # its Idempotency-Key
    step: str
    forward_key: str | None  # Undolog-Forward-Key (compensations)
    backoff: Backoff
    max_retries: int | None
    first_attempt: int
    in_flight: Changes  # written when the call is slow: state Running / effect Executing
    already_in_flight: bool
    retry_reason: EventReason
    counts_retries: bool  # a failed attempt writes retryCount too (compensations)
    attempts: tuple[Attempt, ...] = ()  # the entry's recorded attempts so far
    patient: bool = False  # waits out the participant's outages (compensations: decisions.outage)
    trace: CallTrace | None = None

    def retried(self, record: AttemptRecord, attempts: list[Attempt]) -> Changes:
        """What a failed attempt, to be retried, writes to the entry."""
        changes: Changes = {"last_error": record.error, "attempts": attempts}
        return {"retry_count": record.number, **changes} if self.counts_retries else changes


@dataclass
class EntryCall:
    """A planned call with its arguments and target, and the attempts recorded as it goes."""

    plan: CallPlan
    args: dict[str, Any]
    target: Target
    attempts: list[Attempt] = field(default_factory=list)


@dataclass(frozen=True)
class CallRefused:
    """The call could not be made at all (nothing was sent); `entry` as last written."""

    entry: UndoEntry
    refused: CallNotPossible


@dataclass(frozen=True)
class CallEnded:
    """The call was made: how it ended, its attempts, and `entry` as last written."""

    entry: UndoEntry
    result: CallResult
    attempts: list[Attempt]


def call_trace(saga: Saga, entry: UndoEntry, call: Call, kind: AttemptKind, key: str) -> CallTrace:
    """An entry's call as a span: in the trace the agent that opened the saga was in."""
    return CallTrace(
        name=f"{kind.value.lower()} {call.function}",
        attributes={
            "undolog.saga": saga.reference,
            "undolog.entry": entry.metadata.name,
            "undolog.step": entry.spec.step,
            "undolog.position": entry.spec.stack_position,
            "undolog.function": call.function,
            "undolog.version": call.version,
            "undolog.key": key,
        },
        parent=saga.metadata.annotations.get(TRACEPARENT_ANNOTATION),
    )


def headers_for(saga: Saga, *, key: str, step: str, forward: str | None = None) -> Callable[[int], dict[str, str]]:
    """The wire protocol's headers of each attempt of one call of this saga."""
    return lambda number: protocol.headers(
        idempotency_key=key, saga=saga.reference, step=step, org=saga.spec.org_id, attempt=number, forward=forward
    )


@dataclass
class CallRecorder:
    ledger: Ledger
    registry: Registry
    runner: Runner
    timeline: Timeline

    async def prepare(
        self,
        saga: Saga,
        call: Call,
        outputs: Mapping[str, Mapping[str, Any] | None],
        label: str,
        *,
        missing_as_null: bool,
        kind: AttemptKind,
    ) -> tuple[dict[str, Any], Target] | CallNotPossible:
        """The call's arguments and target, or why the call cannot be made at all (no such
        function, a bad reference, a refused target), recorded as an Event: nothing is sent."""
        try:
            args = resolve(call.args, outputs, missing_as_null=missing_as_null)
            return args, await self.registry.target(saga.metadata.namespace, call)
        except CallNotPossible as refused:
            metrics.series.of(metrics.attempts(kind), saga.metadata.namespace, call.function, "permanent").inc()
            self.timeline.record(saga, refused.reason, f"{label}: {refused.message}; nothing was sent", warning=True)
            return refused

    async def call_entry(
        self, saga: Saga, entry: UndoEntry, outputs: Mapping[str, Mapping[str, Any] | None], plan: CallPlan
    ) -> CallRefused | CallEnded:
        """What a forward call and a compensation share: the call prepared (or why it cannot be
        made, recorded as an Event), made with its retries (each failed attempt written to the
        entry); how it ended is the caller's to record, in one write."""
        kind = plan.kind
        prepared = await self.prepare(
            saga, plan.call, outputs, plan.label, missing_as_null=kind != AttemptKind.FORWARD, kind=kind
        )
        if isinstance(prepared, CallNotPossible):
            return CallRefused(entry, prepared)
        made = EntryCall(plan, *prepared, attempts=list(plan.attempts))
        result, entry = await self.run(saga, entry, made)
        return CallEnded(entry, result, made.attempts)

    async def run(self, saga: Saga, entry: UndoEntry, made: EntryCall) -> tuple[CallResult, UndoEntry]:
        """Make the call; returns its result and the entry as last written. A call that failed
        on a target from the Webhook cache is made once more, continuing its attempt numbers,
        when the API's Webhook now gives another target (fixed before the cache heard of it)."""
        result, entry = await self._attempts(saga, entry, made)
        if result.verdict == Verdict.SUCCEEDED:
            return result, entry
        plan = made.plan
        moved = await self.registry.changed(saga.metadata.namespace, plan.call, made.target)
        if moved is None:
            return result, entry
        why = "its Webhook changed while the call was made; calling the new target"
        self.timeline.record(saga, plan.retry_reason, f"{plan.label}: {why}")
        made.plan = replace(plan, first_attempt=result.last.number + 1, already_in_flight=True)
        made.target = moved
        retried, entry = await self._attempts(saga, entry, made)
        return CallResult(retried.verdict, [*result.attempts, *retried.attempts]), entry

    async def _attempts(self, saga: Saga, entry: UndoEntry, made: EntryCall) -> tuple[CallResult, UndoEntry]:
        attempts = _Attempts(self, saga, entry, made)
        return await attempts.run(), attempts.latest


class _Attempts:
    """One run of an entry's call: its attempts recorded on the entry, and the in-flight mark
    written beside the call when it is slow. The mark and the attempt records share one copy."""

    def __init__(self, recorder: CallRecorder, saga: Saga, entry: UndoEntry, made: EntryCall) -> None:
        self.recorder, self.saga, self.made, self.plan = recorder, saga, made, made.plan
        self.latest = entry
        self.writing = asyncio.Lock()
        self.left = asyncio.Event()
        self.writing_mark = False

    async def run(self) -> CallResult:
        made, plan = self.made, self.plan
        # The call is made in this task and the mark beside it, not the other way round: a task
        # starts on the event loop's next turn, which with sagas failing together came
        # milliseconds after the decision to call.
        marking = None if plan.already_in_flight else asyncio.create_task(self.mark_in_flight())
        try:
            result = await self.recorder.runner.call(
                made.target,
                made.args,
                headers_for(self.saga, key=plan.key, step=plan.step, forward=plan.forward_key),
                backoff=plan.backoff,
                max_retries=plan.max_retries,
                on_attempt=self.on_attempt,
                first_attempt=plan.first_attempt,
                leaving=self.left.set,
                patient=plan.patient,
                trace=plan.trace,
            )
            if marking is not None and self.writing_mark:
                await marking  # the mark's write is in flight: the next write needs its copy
        finally:
            if marking is not None:
                marking.cancel()
        return result

    async def write(self, changes: Changes) -> None:
        async with self.writing:
            status = changed(self.latest.status, changes)
            self.latest = await self.recorder.ledger.write_entry_status(self.latest, status)

    async def on_attempt(self, record: AttemptRecord, delay: float | None) -> None:
        plan, attempts = self.plan, self.made.attempts
        attempts.append(attempt_of(record, plan.kind))
        del attempts[:-MAX_ATTEMPTS]
        metrics.attempted(plan.kind, self.saga.metadata.namespace, plan.call.function, record)
        if delay is None:
            return
        await self.write(plan.in_flight | plan.retried(record, list(attempts)))
        self.recorder.timeline.record(
            self.saga,
            plan.retry_reason,
            f"{plan.label} attempt {record.number}: {record.error}; retrying in {delay:.2f} s",
            warning=True,
        )

    async def mark_in_flight(self) -> None:
        await self.left.wait()
        await asyncio.sleep(IN_FLIGHT_MARK_AFTER)
        self.writing_mark = True
        try:
            await self.write(self.plan.in_flight)
        except KubeError as error:  # only a mark for people: never cut off a call sent for it
            log.warning("%s is in flight; that could not be marked: %s", self.latest.reference, error.message)


def failure_changes(result: CallResult, saga: Saga, label: str, event: EventReason, timeline: Timeline) -> Changes:
    """A call that ended in failure: said in a Warning Event, and the entry's lastError and reason."""
    last = result.last
    if result.verdict == Verdict.UNAVAILABLE:
        # A certificate that stayed rejected is named as such: renewing it is the fix.
        reason = EntryReason.CERTIFICATE_REJECTED if last.outcome.certificate else EntryReason.PARTICIPANT_UNAVAILABLE
        why = "its outage budget spent"
    elif last.outcome.refusal is not None:
        why, reason = "refused: nothing was sent", EntryReason.TARGET_REFUSED
    elif last.outcome.conflict:
        why, reason = (
            "the participant says what the step left has changed since: a person decides",
            EntryReason.CONFLICT,
        )
    elif result.verdict == Verdict.PERMANENT:
        why, reason = "permanent failure", EntryReason.PERMANENT_FAILURE
    elif last.outcome.certificate is not None:
        why, reason = f"gave up after {last.number} attempts", EntryReason.CERTIFICATE_REJECTED
    else:
        why, reason = f"gave up after {last.number} attempts", EntryReason.RETRIES_EXHAUSTED
    timeline.record(saga, event, f"{label}: {last.error} ({why})", warning=True)
    return {"last_error": clip(f"{last.error} ({why})"), "reason": reason}
