"""Compensating one UndoEntry: Running, the call with its retries, then Compensated or Failed.

Each failed attempt is written to the entry (retryCount, lastError, attempts) and posted as an
Event before the next one starts; a crash at any point leaves the entry Pending or Running,
and the next operator sends it again under the same Idempotency-Key.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from undolog import metrics
from undolog.api.saga import Saga
from undolog.api.undo_entry import MAX_ATTEMPTS, AttemptKind, UndoEntry
from undolog.calls import protocol, registry
from undolog.calls.runner import AttemptRecord, Runner
from undolog.controller.ledger import Ledger
from undolog.controller.timeline import Timeline
from undolog.decisions.arguments import UnresolvedReference, resolve
from undolog.decisions.retry import classify
from undolog.kube import Body

RUNNING_MARK_AFTER = 0.5  # seconds a call may take before its entry is marked Running


def attempt_status(record: AttemptRecord, kind: AttemptKind) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "kind": kind,
        "time": record.started_at.isoformat().replace("+00:00", "Z"),
        "number": record.number,
        "durationMilliseconds": record.duration_milliseconds,
    }
    if record.outcome.status_code is not None:
        entry["statusCode"] = record.outcome.status_code
    if record.error:
        entry["error"] = record.error[:1024]
    return entry


def now_text() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


@dataclass
class Compensator:
    ledger: Ledger
    runner: Runner
    timeline: Timeline

    async def compensate(
        self, saga: Saga, saga_body: Body, entry_body: Body, outputs: Mapping[str, Mapping[str, Any] | None]
    ) -> Body:
        entry = UndoEntry.model_validate(entry_body)
        name, call = entry.metadata.name, entry.spec.compensation
        if call is None:
            body = await self.ledger.write_entry_status(
                entry_body, {"state": "Skipped", "skipReason": "the step has no compensation (Pivot or Retriable)"}
            )
            self.timeline.record(saga_body, "EntrySkipped", f"{name} (step {entry.spec.step}) has no compensation")
            return body
        function = f"{call.function} {call.version}"
        try:
            args = resolve(call.args, outputs, missing_as_null=True)
            target = await registry.resolve(self.ledger.kube, saga.metadata.namespace, call)
        except (registry.CallNotPossible, UnresolvedReference) as error:
            reason = error.reason if isinstance(error, registry.CallNotPossible) else "UnresolvedReference"
            message = error.message if isinstance(error, registry.CallNotPossible) else str(error)
            metrics.compensation_attempts.labels(call.function, "permanent").inc()
            self.timeline.record(saga_body, reason, f"{name} ({function}): {message}; nothing was sent", warning=True)
            return await self.ledger.write_entry_status(
                entry_body, {"state": "Failed", "lastError": f"{reason}: {message}"}
            )

        attempts = [a.to_api() for a in entry.status.attempts]
        saga_ref = f"{saga.metadata.namespace}/{saga.metadata.name}"
        writing = asyncio.Lock()  # the lazy Running mark and the attempt records share one copy

        async def write(changes: Body) -> None:
            nonlocal entry_body
            async with writing:
                entry_body = await self.ledger.write_entry_status(entry_body, changes)

        def headers(number: int) -> dict[str, str]:
            return protocol.headers(
                idempotency_key=protocol.compensation_key(entry.spec.undo_id),
                saga=saga_ref,
                step=entry.spec.step,
                org=saga.spec.org_id,
                attempt=number,
                forward=entry.spec.effect_id,
            )

        async def on_attempt(record: AttemptRecord, delay: float | None) -> None:
            attempts.append(attempt_status(record, "Compensation"))
            del attempts[:-MAX_ATTEMPTS]
            metrics.compensation_seconds.labels(call.function).observe(record.duration_milliseconds / 1000)
            metrics.compensation_attempts.labels(call.function, classify(record.outcome).lower()).inc()
            if delay is None:
                return
            await write(
                {"state": "Running", "retryCount": record.number, "lastError": record.error, "attempts": attempts}
            )
            self.timeline.record(
                saga_body,
                "CompensationRetry",
                f"{name} ({function}) attempt {record.number}: {record.error}; retrying in {delay:.2f} s",
                warning=True,
            )

        calling = asyncio.create_task(
            self.runner.call(
                target,
                args,
                headers,
                backoff=saga.spec.compensation_policy.backoff,
                max_retries=call.max_retries,
                on_attempt=on_attempt,
                first_attempt=entry.status.retry_count + 1,
            )
        )
        try:
            # Running is for people watching (after a crash Pending and Running are sent again
            # alike, under the same key), so it is written only for a call not over at once.
            finished, _ = await asyncio.wait({calling}, timeout=RUNNING_MARK_AFTER)
            if not finished and entry.status.state != "Running":
                await write({"state": "Running"})
            result = await calling
        finally:
            calling.cancel()
        last = result.last
        if result.verdict == "Succeeded":
            self.timeline.record(
                saga_body,
                "EntryCompensated",
                f"{name} (step {entry.spec.step}, {function}): HTTP {last.outcome.status_code} "
                f"in {last.duration_milliseconds} ms, attempt {last.number}",
            )
            await write(
                {
                    "state": "Compensated",
                    "compensatedAt": now_text(),
                    "retryCount": last.number - 1,
                    "attempts": attempts,
                }
            )
            return entry_body
        why = "permanent failure" if result.verdict == "Permanent" else f"gave up after {last.number} attempts"
        self.timeline.record(
            saga_body, "CompensationFailed", f"{name} ({function}): {last.error} ({why})", warning=True
        )
        await write(
            {
                "state": "Failed",
                "lastError": f"{last.error} ({why})",
                "retryCount": last.number - 1,
                "attempts": attempts,
            }
        )
        return entry_body
