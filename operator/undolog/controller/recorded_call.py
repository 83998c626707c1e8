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


@dataclass
class EntryCall:
    """What differs between a forward call and a compensation of one entry."""

    kind: AttemptKind
    label: str  # "<entry> (step <step>, <function> <version>)" in Events
    call: Call
    target: Target
    args: dict[str, Any]
    headers: Callable[[int], dict[str, str]]
    backoff: Backoff
    max_retries: int | None
    first_attempt: int
    in_flight: Changes  # written when the call is slow: state Running / effect Executing
    already_in_flight: bool
    retried: Callable[[AttemptRecord, list[Attempt]], Changes]  # written after a failed attempt
    retry_reason: EventReason
    attempts: list[Attempt] = field(default_factory=list)  # the entry's recorded attempts so far
    patient: bool = False  # waits out the participant's outages (compensations: decisions.outage)
    trace: CallTrace | None = None


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
        self,
        saga: Saga,
        entry: UndoEntry,
        call: Call,
        outputs: Mapping[str, Mapping[str, Any] | None],
        *,
        kind: AttemptKind,
        label: str,
        impossible: Callable[[CallNotPossible], Changes],
        spec: Callable[[dict[str, Any], Target], EntryCall],
        ended: Callable[[CallResult, EntryCall], Changes],
    ) -> UndoEntry:
        """What a forward call and a compensation share: the call prepared (or why it cannot be
        made, recorded), made with its retries, and how it ended recorded on the entry."""
        prepared = await self.prepare(
            saga, call, outputs, label, missing_as_null=kind != AttemptKind.FORWARD, kind=kind
        )
        if isinstance(prepared, CallNotPossible):
            return await self.ledger.write_entry_status(entry, changed(entry.status, impossible(prepared)))
        made = spec(*prepared)
        result, entry = await self.run(saga, entry, made)
        return await self.ledger.write_entry_status(entry, changed(entry.status, ended(result, made)))

    async def run(self, saga: Saga, entry: UndoEntry, spec: EntryCall) -> tuple[CallResult, UndoEntry]:
        """Make the call; returns its result and the entry as last written. A call that failed
        on a target from the Webhook cache is made once more, continuing its attempt numbers,
        when the API's Webhook now gives another target (fixed before the cache heard of it)."""
        result, entry = await self._attempts(saga, entry, spec)
        if result.verdict == Verdict.SUCCEEDED:
            return result, entry
        moved = await self.registry.changed(saga.metadata.namespace, spec.call, spec.target)
        if moved is None:
            return result, entry
        why = "its Webhook changed while the call was made; calling the new target"
        self.timeline.record(saga, spec.retry_reason, f"{spec.label}: {why}")
        again = replace(spec, target=moved, first_attempt=result.last.number + 1, already_in_flight=True)
        retried, entry = await self._attempts(saga, entry, again)
        return CallResult(retried.verdict, [*result.attempts, *retried.attempts]), entry

    async def _attempts(self, saga: Saga, entry: UndoEntry, spec: EntryCall) -> tuple[CallResult, UndoEntry]:
        attempts = _Attempts(self, saga, entry, spec)
        return await attempts.run(), attempts.latest


class _Attempts:
    """One run of an entry's call: its attempts recorded on the entry, and the in-flight mark
    written beside the call when it is slow. The mark and the attempt records share one copy."""

    def __init__(self, recorder: CallRecorder, saga: Saga, entry: UndoEntry, spec: EntryCall) -> None:
        self.recorder, self.saga, self.spec = recorder, saga, spec
        self.latest = entry
        self.writing = asyncio.Lock()
        self.left = asyncio.Event()
        self.writing_mark = False

    async def run(self) -> CallResult:
        spec = self.spec
        # The call is made in this task and the mark beside it, not the other way round: a task
        # starts on the event loop's next turn, which with sagas failing together came
        # milliseconds after the decision to call.
        marking = None if spec.already_in_flight else asyncio.create_task(self.mark_in_flight())
        try:
            result = await self.recorder.runner.call(
                spec.target,
                spec.args,
                spec.headers,
                backoff=spec.backoff,
                max_retries=spec.max_retries,
                on_attempt=self.on_attempt,
                first_attempt=spec.first_attempt,
                leaving=self.left.set,
                patient=spec.patient,
                trace=spec.trace,
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
        spec = self.spec
        spec.attempts.append(attempt_of(record, spec.kind))
        del spec.attempts[:-MAX_ATTEMPTS]
        metrics.attempted(spec.kind, self.saga.metadata.namespace, spec.call.function, record)
        if delay is None:
            return
        await self.write(spec.in_flight | spec.retried(record, list(spec.attempts)))
        self.recorder.timeline.record(
            self.saga,
            spec.retry_reason,
            f"{spec.label} attempt {record.number}: {record.error}; retrying in {delay:.2f} s",
            warning=True,
        )

    async def mark_in_flight(self) -> None:
        await self.left.wait()
        await asyncio.sleep(IN_FLIGHT_MARK_AFTER)
        self.writing_mark = True
        try:
            await self.write(self.spec.in_flight)
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
    elif result.verdict == Verdict.PERMANENT:
        why, reason = "permanent failure", EntryReason.PERMANENT_FAILURE
    elif last.outcome.certificate is not None:
        why, reason = f"gave up after {last.number} attempts", EntryReason.CERTIFICATE_REJECTED
    else:
        why, reason = f"gave up after {last.number} attempts", EntryReason.RETRIES_EXHAUSTED
    timeline.record(saga, event, f"{label}: {last.error} ({why})", warning=True)
    return {"last_error": clip(f"{last.error} ({why})"), "reason": reason}
