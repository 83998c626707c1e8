"""Compensating one UndoEntry: the call with its retries, then Compensated or Failed.

An entry with a guard has what its step left read again first (guarding.py); a later change
there halts it as Conflict, unsent. A change to a Kubernetes object is undone over the API
instead of by a call (object_undo.py). Each failed attempt is written to the entry (retryCount,
lastError, attempts) and posted as an Event before the next one starts; a crash at any point
leaves the entry Pending or Running, and the next operator sends it again under the same
Idempotency-Key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from undolog.api import AttemptKind, Call, EntryReason, EntryState, EventReason, ObjectUndo, Saga, SagaPhase, UndoEntry
from undolog.api.changes import EntryStatusChange, changed
from undolog.calls.runner import CallResult
from undolog.controller.guarding import Guarding, NotUndone
from undolog.controller.object_undo import ObjectUndoer
from undolog.controller.recorded_call import CallPlan, CallRecorder, CallRefused, call_trace, failure_changes
from undolog.conventions import clip, compensation_key, now
from undolog.decisions import compensation_plan, entry_changes
from undolog.decisions.retry import Verdict


def rewound(saga: Saga) -> EntryStatusChange:
    """An entry settled while its saga rewinds is history from then on."""
    return {"rewound_at": now()} if saga.status.phase == SagaPhase.REWINDING else {}


@dataclass
class Compensator:
    recorder: CallRecorder
    objects: ObjectUndoer

    async def _skipped(self, saga: Saga, entry: UndoEntry, reason: EntryReason, why: str) -> UndoEntry:
        """Settled without a call: there is nothing to call, or nothing was ever done."""
        self.recorder.timeline.record(
            saga, EventReason.ENTRY_SKIPPED, f"{entry.metadata.name} (step {entry.spec.step}): {why}"
        )
        skipped = entry_changes.skipped(reason, why) | rewound(saga)
        return await self.recorder.ledger.write_entry_status(entry, changed(entry.status, skipped))

    async def compensate(
        self, saga: Saga, entry: UndoEntry, outputs: Mapping[str, Mapping[str, Any] | None]
    ) -> UndoEntry:
        call = compensation_plan.call_or_skip(entry)
        if isinstance(call, ObjectUndo):
            return await self.objects.undo(saga, entry, call)
        if not isinstance(call, Call):
            return await self._skipped(saga, entry, *call)
        checked = await Guarding(self.recorder).check(saga, entry, outputs, self._plan(saga, entry, call))
        if isinstance(checked, NotUndone):  # what the step left changed since, or could not be read
            entry, not_undone = checked.entry, changed(checked.entry.status, checked.changes)
            return await self.recorder.ledger.write_entry_status(entry, not_undone)
        entry = checked
        plan = self._plan(saga, entry, call)  # of the entry as the read left it (its attempts, its mark)
        ended = await self.recorder.call_entry(saga, entry, outputs, plan)
        if isinstance(ended, CallRefused):
            refused = ended.refused
            changes: EntryStatusChange = {
                "state": EntryState.FAILED,
                "reason": refused.reason,
                "last_error": clip(str(refused)),
            }
        else:
            result = ended.result
            changes = self._outcome(saga, result, plan.label) | {
                "retry_count": result.last.number - 1,
                "attempts": ended.attempts,
            }
        return await self.recorder.ledger.write_entry_status(ended.entry, changed(ended.entry.status, changes))

    @staticmethod
    def _plan(saga: Saga, entry: UndoEntry, call: Call) -> CallPlan:
        key = compensation_key(entry.spec.undo_id)
        return CallPlan(
            kind=AttemptKind.COMPENSATION,
            label=f"{entry.metadata.name} (step {entry.spec.step}, {call.function} {call.version})",
            call=call,
            key=key,
            step=entry.spec.step,
            forward_key=entry.spec.effect_id,
            backoff=saga.spec.compensation_policy.backoff,
            max_retries=call.max_retries,
            first_attempt=entry.status.retry_count + 1,
            in_flight={"state": EntryState.RUNNING},
            already_in_flight=entry.status.state == EntryState.RUNNING,
            retry_reason=EventReason.COMPENSATION_RETRY,
            counts_retries=True,
            attempts=tuple(entry.status.attempts),
            patient=True,
            trace=call_trace(saga, entry, call, AttemptKind.COMPENSATION, key),
        )

    def _outcome(self, saga: Saga, result: CallResult, label: str) -> EntryStatusChange:
        """The entry's state once its call is over: Compensated, or Failed with why."""
        timeline, last = self.recorder.timeline, result.last
        if result.verdict != Verdict.SUCCEEDED:
            return {"state": EntryState.FAILED} | failure_changes(
                result, saga, label, EventReason.COMPENSATION_FAILED, timeline
            )
        timeline.record(
            saga,
            EventReason.ENTRY_COMPENSATED,
            f"{label}: HTTP {last.outcome.status_code} in {last.duration_milliseconds} ms, attempt {last.number}",
        )
        return entry_changes.compensated(now(), rewinding=saga.status.phase == SagaPhase.REWINDING)
