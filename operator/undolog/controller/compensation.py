"""Compensating one UndoEntry: the call with its retries, then Compensated or Failed.

Each failed attempt is written to the entry (retryCount, lastError, attempts) and posted as an
Event before the next one starts; a crash at any point leaves the entry Pending or Running,
and the next operator sends it again under the same Idempotency-Key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from undolog.api import Attempt, AttemptKind, Call, EntryReason, EntryState, EventReason, Saga, SagaPhase, UndoEntry
from undolog.api.changes import EntryStatusChange, changed
from undolog.calls.runner import AttemptRecord, CallResult
from undolog.calls.transport import Target
from undolog.controller.recorded_call import CallRecorder, EntryCall, call_trace, failure_changes, headers_for
from undolog.conventions import clip, compensation_key, now
from undolog.decisions import compensation_plan, entry_changes
from undolog.decisions.retry import Verdict


def rewound(saga: Saga) -> EntryStatusChange:
    """An entry settled while its saga rewinds is history from then on."""
    return {"rewound_at": now()} if saga.status.phase == SagaPhase.REWINDING else {}


@dataclass
class Compensator:
    recorder: CallRecorder

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
        if not isinstance(call, Call):
            return await self._skipped(saga, entry, *call)
        label = f"{entry.metadata.name} (step {entry.spec.step}, {call.function} {call.version})"
        return await self.recorder.call_entry(
            saga,
            entry,
            call,
            outputs,
            kind=AttemptKind.COMPENSATION,
            label=label,
            impossible=lambda refused: {
                "state": EntryState.FAILED,
                "reason": refused.reason,
                "last_error": clip(str(refused)),
            },
            spec=lambda args, target: self._spec(saga, entry, call, label, args, target),
            ended=lambda result, spec: (
                self._outcome(saga, result, label) | {"retry_count": result.last.number - 1, "attempts": spec.attempts}
            ),
        )

    @staticmethod
    def _spec(saga: Saga, entry: UndoEntry, call: Call, label: str, args: dict[str, Any], target: Target) -> EntryCall:
        def retried(record: AttemptRecord, attempts: list[Attempt]) -> EntryStatusChange:
            return {"retry_count": record.number, "last_error": record.error, "attempts": attempts}

        return EntryCall(
            kind=AttemptKind.COMPENSATION,
            label=label,
            call=call,
            target=target,
            args=args,
            headers=headers_for(
                saga, key=compensation_key(entry.spec.undo_id), step=entry.spec.step, forward=entry.spec.effect_id
            ),
            backoff=saga.spec.compensation_policy.backoff,
            max_retries=call.max_retries,
            first_attempt=entry.status.retry_count + 1,
            in_flight={"state": EntryState.RUNNING},
            already_in_flight=entry.status.state == EntryState.RUNNING,
            retried=retried,
            retry_reason=EventReason.COMPENSATION_RETRY,
            attempts=list(entry.status.attempts),
            patient=True,
            trace=call_trace(saga, entry, call, AttemptKind.COMPENSATION, compensation_key(entry.spec.undo_id)),
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
        return {"state": EntryState.COMPENSATED, "compensated_at": now(), "reason": None} | rewound(saga)
