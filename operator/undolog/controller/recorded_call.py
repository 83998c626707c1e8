"""One entry's call with its retries, each failed attempt written to the entry (and posted as
an Event) before the next starts. Shared by forward calls and compensations.

The entry is marked in flight (Executing / Running) only when the call is not over within
IN_FLIGHT_MARK_AFTER: the mark is for people watching. After a crash, Pending and in-flight
entries alike are sent again under the same Idempotency-Key.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from prometheus_client import Counter, Histogram

from undolog.api.common import Call
from undolog.api.saga import Backoff, Saga
from undolog.api.undo_entry import MAX_ATTEMPTS, AttemptKind
from undolog.calls import protocol, registry
from undolog.calls.registry import Target
from undolog.calls.runner import AttemptRecord, CallResult, Runner
from undolog.controller.ledger import Ledger
from undolog.controller.timeline import Timeline
from undolog.decisions.arguments import UnresolvedReference, resolve
from undolog.decisions.retry import classify
from undolog.kube import Body

IN_FLIGHT_MARK_AFTER = 0.5  # seconds a call may take before its entry is marked in flight


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
class EntryCall:
    """What differs between a forward call and a compensation of one entry."""

    kind: AttemptKind
    label: str  # "<entry> (<function> <version>)" in Events
    call: Call
    target: Target
    args: dict[str, Any]
    headers: Callable[[int], dict[str, str]]
    backoff: Backoff
    max_retries: int | None
    first_attempt: int
    in_flight: Body  # status written when the call is slow: {"state": "Running"} / {"effect": "Executing"}
    already_in_flight: bool
    retried: Callable[[AttemptRecord, list[Body]], Body]  # status written after a failed attempt
    attempts_metric: Counter
    seconds_metric: Histogram
    attempts: list[Body] = field(default_factory=list)  # the entry's recorded attempts so far


def headers_for(saga: Saga, *, key: str, step: str, forward: str | None = None) -> Callable[[int], dict[str, str]]:
    """The wire protocol's headers of each attempt of one call of this saga."""
    reference = f"{saga.metadata.namespace}/{saga.metadata.name}"
    return lambda number: protocol.headers(
        idempotency_key=key, saga=reference, step=step, org=saga.spec.org_id, attempt=number, forward=forward
    )


@dataclass
class CallRecorder:
    ledger: Ledger
    runner: Runner
    timeline: Timeline

    async def prepare(
        self,
        saga: Saga,
        saga_body: Body,
        call: Call,
        outputs: Mapping[str, Mapping[str, Any] | None],
        label: str,
        *,
        missing_as_null: bool,
        counter: Counter,
    ) -> tuple[dict[str, Any], Target] | str:
        """The call's arguments and target, or, for a call that cannot be made at all (no such
        function, a bad reference), its "Reason: message", recorded as an Event: nothing is sent."""
        try:
            args = resolve(call.args, outputs, missing_as_null=missing_as_null)
            return args, await registry.resolve(self.ledger.kube, saga.metadata.namespace, call)
        except registry.CallNotPossible as error:
            reason, message = error.reason, error.message
        except UnresolvedReference as error:
            reason, message = "UnresolvedReference", str(error)
        counter.labels(call.function, "permanent").inc()
        self.timeline.record(saga_body, reason, f"{label}: {message}; nothing was sent", warning=True)
        return f"{reason}: {message}"

    async def run(self, saga_body: Body, entry_body: Body, spec: EntryCall) -> tuple[CallResult, Body]:
        """Make the call; returns its result and the entry as last written."""
        writing = asyncio.Lock()  # the in-flight mark and the attempt records share one copy
        latest = entry_body

        async def write(changes: Body) -> None:
            nonlocal latest
            async with writing:
                latest = await self.ledger.write_entry_status(latest, changes)

        async def on_attempt(record: AttemptRecord, delay: float | None) -> None:
            spec.attempts.append(attempt_status(record, spec.kind))
            del spec.attempts[:-MAX_ATTEMPTS]
            spec.seconds_metric.labels(spec.call.function).observe(record.duration_milliseconds / 1000)
            spec.attempts_metric.labels(spec.call.function, classify(record.outcome).lower()).inc()
            if delay is None:
                return
            await write({**spec.in_flight, **spec.retried(record, spec.attempts)})
            self.timeline.record(
                saga_body,
                f"{spec.kind}Retry",
                f"{spec.label} attempt {record.number}: {record.error}; retrying in {delay:.2f} s",
                warning=True,
            )

        calling = asyncio.create_task(
            self.runner.call(
                spec.target,
                spec.args,
                spec.headers,
                backoff=spec.backoff,
                max_retries=spec.max_retries,
                on_attempt=on_attempt,
                first_attempt=spec.first_attempt,
            )
        )
        try:
            finished, _ = await asyncio.wait({calling}, timeout=IN_FLIGHT_MARK_AFTER)
            if not finished and not spec.already_in_flight:
                await write(spec.in_flight)
            result = await calling
        finally:
            calling.cancel()
        return result, latest
