"""Compensating one UndoEntry: the call with its retries, then Compensated or Failed.

Each failed attempt is written to the entry (retryCount, lastError, attempts) and posted as an
Event before the next one starts; a crash at any point leaves the entry Pending or Running,
and the next operator sends it again under the same Idempotency-Key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from undolog import metrics
from undolog.api.saga import Saga
from undolog.api.undo_entry import UndoEntry
from undolog.calls import protocol
from undolog.calls.runner import AttemptRecord
from undolog.controller.recorded_call import CallRecorder, EntryCall, headers_for, now_text
from undolog.kube import Body


@dataclass
class Compensator:
    recorder: CallRecorder

    async def compensate(
        self, saga: Saga, saga_body: Body, entry_body: Body, outputs: Mapping[str, Mapping[str, Any] | None]
    ) -> Body:
        ledger, timeline = self.recorder.ledger, self.recorder.timeline
        entry = UndoEntry.model_validate(entry_body)
        name, call = entry.metadata.name, entry.spec.compensation
        if call is None:
            timeline.record(saga_body, "EntrySkipped", f"{name} (step {entry.spec.step}) has no compensation")
            return await ledger.write_entry_status(
                entry_body, {"state": "Skipped", "skipReason": "the step has no compensation (Pivot or Retriable)"}
            )
        label = f"{name} (step {entry.spec.step}, {call.function} {call.version})"
        prepared = await self.recorder.prepare(
            saga, saga_body, call, outputs, label, missing_as_null=True, counter=metrics.compensation_attempts
        )
        if isinstance(prepared, str):
            return await ledger.write_entry_status(entry_body, {"state": "Failed", "lastError": prepared})
        args, target = prepared

        def retried(record: AttemptRecord, attempts: list[Body]) -> Body:
            return {"retryCount": record.number, "lastError": record.error, "attempts": attempts}

        spec = EntryCall(
            kind="Compensation",
            label=label,
            call=call,
            target=target,
            args=args,
            headers=headers_for(
                saga,
                key=protocol.compensation_key(entry.spec.undo_id),
                step=entry.spec.step,
                forward=entry.spec.effect_id,
            ),
            backoff=saga.spec.compensation_policy.backoff,
            max_retries=call.max_retries,
            first_attempt=entry.status.retry_count + 1,
            in_flight={"state": "Running"},
            already_in_flight=entry.status.state == "Running",
            retried=retried,
            attempts_metric=metrics.compensation_attempts,
            seconds_metric=metrics.compensation_seconds,
            attempts=[a.to_api() for a in entry.status.attempts],
        )
        result, entry_body = await self.recorder.run(saga_body, entry_body, spec)
        last = result.last
        if result.verdict == "Succeeded":
            timeline.record(
                saga_body,
                "EntryCompensated",
                f"{label}: HTTP {last.outcome.status_code} in {last.duration_milliseconds} ms, attempt {last.number}",
            )
            changes: Body = {"state": "Compensated", "compensatedAt": now_text()}
        else:
            why = "permanent failure" if result.verdict == "Permanent" else f"gave up after {last.number} attempts"
            timeline.record(saga_body, "CompensationFailed", f"{label}: {last.error} ({why})", warning=True)
            changes = {"state": "Failed", "lastError": f"{last.error} ({why})"}
        changes |= {"retryCount": last.number - 1, "attempts": spec.attempts}
        return await ledger.write_entry_status(entry_body, changes)
