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
from undolog.calls import protocol, registry
from undolog.calls.runner import AttemptRecord
from undolog.controller.recorded_call import CallRecorder, EntryCall, now_text
from undolog.decisions.arguments import UnresolvedReference, resolve
from undolog.kube import Body


def not_possible(error: registry.CallNotPossible | UnresolvedReference) -> tuple[str, str]:
    """(reason, message) of a call that cannot be made at all."""
    if isinstance(error, registry.CallNotPossible):
        return error.reason, error.message
    return "UnresolvedReference", str(error)


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
        try:
            args = resolve(call.args, outputs, missing_as_null=True)
            target = await registry.resolve(ledger.kube, saga.metadata.namespace, call)
        except (registry.CallNotPossible, UnresolvedReference) as error:
            reason, message = not_possible(error)
            metrics.compensation_attempts.labels(call.function, "permanent").inc()
            timeline.record(saga_body, reason, f"{label}: {message}; nothing was sent", warning=True)
            return await ledger.write_entry_status(entry_body, {"state": "Failed", "lastError": f"{reason}: {message}"})

        def retried(record: AttemptRecord, attempts: list[Body]) -> Body:
            return {"retryCount": record.number, "lastError": record.error, "attempts": attempts}

        saga_ref = f"{saga.metadata.namespace}/{saga.metadata.name}"
        spec = EntryCall(
            kind="Compensation",
            label=label,
            call=call,
            target=target,
            args=args,
            headers=lambda number: protocol.headers(
                idempotency_key=protocol.compensation_key(entry.spec.undo_id),
                saga=saga_ref,
                step=entry.spec.step,
                org=saga.spec.org_id,
                attempt=number,
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
