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
from undolog.calls.runner import AttemptRecord
from undolog.controller.recorded_call import CallRecorder, EntryCall, failure_changes, headers_for
from undolog.conventions import clip, compensation_key, now
from undolog.decisions import compensation_plan
from undolog.decisions.retry import Verdict
from undolog.errors import CallNotPossible


def rewound(saga: Saga) -> dict[str, Any]:
    """An entry settled while its saga rewinds is history from then on."""
    return {"rewound_at": now()} if saga.status.phase == SagaPhase.REWINDING else {}


@dataclass
class Compensator:
    recorder: CallRecorder

    async def compensate(
        self, saga: Saga, entry: UndoEntry, outputs: Mapping[str, Mapping[str, Any] | None]
    ) -> UndoEntry:
        ledger, timeline = self.recorder.ledger, self.recorder.timeline
        name, call = entry.metadata.name, compensation_plan.call_or_skip(entry)
        if not isinstance(call, Call):
            reason, why = call
            timeline.record(saga, EventReason.ENTRY_SKIPPED, f"{name} (step {entry.spec.step}): {why}")
            skipped = {"state": EntryState.SKIPPED, "reason": reason, "skip_reason": why} | rewound(saga)
            return await ledger.write_entry_status(entry, entry.status.model_copy(update=skipped))
        label = f"{name} (step {entry.spec.step}, {call.function} {call.version})"
        prepared = await self.recorder.prepare(
            saga, call, outputs, label, missing_as_null=True, kind=AttemptKind.COMPENSATION
        )
        if isinstance(prepared, CallNotPossible):
            failed = entry.status.model_copy(
                update={
                    "state": EntryState.FAILED,
                    "reason": EntryReason(prepared.reason),
                    "last_error": clip(str(prepared)),
                }
            )
            return await ledger.write_entry_status(entry, failed)
        args, target = prepared

        def retried(record: AttemptRecord, attempts: list[Attempt]) -> dict[str, Any]:
            return {"retry_count": record.number, "last_error": record.error, "attempts": attempts}

        spec = EntryCall(
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
        )
        result, entry = await self.recorder.run(saga, entry, spec)
        last = result.last
        changes: dict[str, Any] = {"retry_count": last.number - 1, "attempts": spec.attempts}
        if result.verdict == Verdict.SUCCEEDED:
            timeline.record(
                saga,
                EventReason.ENTRY_COMPENSATED,
                f"{label}: HTTP {last.outcome.status_code} in {last.duration_milliseconds} ms, attempt {last.number}",
            )
            changes |= {"state": EntryState.COMPENSATED, "compensated_at": now(), "reason": None} | rewound(saga)
        else:
            changes |= {"state": EntryState.FAILED}
            changes |= failure_changes(result, saga, label, EventReason.COMPENSATION_FAILED, timeline)
        return await ledger.write_entry_status(entry, entry.status.model_copy(update=changes))
