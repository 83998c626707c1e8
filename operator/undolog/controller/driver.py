"""One saga's driver: decide, apply, repeat until the decision is to wait.

Woken by watch events (the saga's or its entries'), by a deadline, or after a failure with
backoff. It holds no state that matters across restarts: everything it acts on is read from
the API, and every write is conditional on what it read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from undolog import metrics
from undolog.api.saga import EffectStatus, LostEntry, Saga, SagaPhase, SagaStatus
from undolog.api.undo_entry import UndoEntry
from undolog.controller.forward import owned_by
from undolog.decisions import lifo, moves, phases
from undolog.kube import ApiException, Body, refusal, trimmed

if TYPE_CHECKING:
    from undolog.controller.engine import Engine

log = logging.getLogger("undolog.driver")
MAX_FAILURE_DELAY = 30.0
COUNTER_INTERVAL = 5.0  # seconds between progress writes of stackDepth and compensatedCount


def utcnow() -> datetime:
    return datetime.now(UTC)


def fresher(a: Body | None, b: Body | None) -> Body | None:
    """The newer of two copies of a saga; None when they cannot be ordered (read it again).

    resourceVersions are opaque; etcd's are integers, and then an event that arrives while a
    write is in flight, or a write response older than an event already seen, is ordered.
    """
    if a is None or b is None:
        return a if b is None else b
    ra, rb = a["metadata"].get("resourceVersion", ""), b["metadata"].get("resourceVersion", "")
    if ra.isascii() and rb.isascii() and ra.isdigit() and rb.isdigit():
        return a if int(ra) >= int(rb) else b
    return None


class SagaDriver:
    def __init__(self, engine: Engine, namespace: str, name: str) -> None:
        self.engine = engine
        self.namespace, self.name = namespace, name
        self.latest: Body | None = None
        self.gone = False
        self.wake = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.last_status_write = 0.0
        self.last_error: str | None = None
        self.lost: list[LostEntry] = []  # entries gone since the last reconcile, to be reported
        self.verified = False  # the entries were listed (or shown complete) since compensation began

    def lose(self, entry: Body, why: str) -> None:
        """An entry can no longer be compensated: record it on the saga at the next reconcile."""
        spec = entry.get("spec", {})
        compensation = spec.get("compensation") or {}
        self.lost.append(
            LostEntry(
                name=entry["metadata"]["name"],
                stack_position=spec.get("stackPosition"),
                step=spec.get("step"),
                function=compensation.get("function"),
                why=why[:1024],
            )
        )
        self.wake.set()

    def notify(self, body: Body | None) -> None:
        if body is None:
            self.gone = True
        else:
            self.latest = fresher(trimmed(body), self.latest)
        self.wake.set()

    async def run(self) -> None:
        failures = 0
        while not self.gone:
            self.wake.clear()
            try:
                async with self.engine.slots:  # bounded: memory and fairness with thousands of sagas
                    wait = await self.reconcile()
                failures, self.last_error = 0, None
            except ApiException as error:
                if error.status == 404:
                    return  # deleted: nothing of ours is left to hold
                if error.status == 409:  # someone wrote first: read again and decide again
                    self.latest = None
                    continue
                failures += 1
                wait = self._backoff(failures, error)
            except Exception as error:
                failures += 1
                wait = self._backoff(failures, error)
            if wait.finished and not self.wake.is_set():
                return
            timeout = None if wait.until is None else max((wait.until - utcnow()).total_seconds(), 0.0)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), timeout)

    def _backoff(self, failures: int, error: BaseException) -> moves.Wait:
        delay = min(2.0 ** (failures - 1), MAX_FAILURE_DELAY)
        log.error("saga %s/%s: %s; retrying in %.0f s", self.namespace, self.name, error, delay, exc_info=error)
        text = refusal(error) if isinstance(error, ApiException) else f"{type(error).__name__}: {error}"
        if text != self.last_error and self.latest is not None:  # say it once, not at every retry
            self.engine.timeline.record(self.latest, "OperatorError", f"{text}; retrying with backoff", warning=True)
        self.last_error = text
        return moves.Wait(until=utcnow() + timedelta(seconds=delay))

    async def reconcile(self) -> moves.Wait:
        ledger = self.engine.ledger
        saga_body = self.latest or await ledger.saga(self.namespace, self.name)
        uid = saga_body["metadata"]["uid"]
        entries = await self.entries(saga_body)
        # Entries of an earlier saga with the same name, not yet collected, are not ours.
        entries = {name: e for name, e in entries.items() if owned_by(e, uid)}
        for name, body in list(entries.items()):
            try:
                UndoEntry.model_validate(body)
            except ValidationError as error:  # the API took it, the operator cannot use it: report it
                del entries[name]
                self.lose(body, f"unreadable: {error.errors()[0]['loc']}: {error.errors()[0]['msg']}")
        while True:
            if self.lost:  # noticed by the watch meanwhile: never compensate from a stale copy
                for lost in self.lost:
                    entries.pop(lost.name, None)
                saga_body = await self.report_lost(Saga.model_validate(saga_body), saga_body)
            saga = Saga.model_validate(saga_body)
            parsed = [UndoEntry.model_validate(e) for e in entries.values()]
            move = phases.decide(saga, parsed, utcnow())
            log.debug("saga %s/%s: %s", self.namespace, self.name, type(move).__name__)
            if isinstance(move, moves.Wait):
                self.latest = fresher(saga_body, self.latest)
                return move
            try:
                written = await self.apply(move, saga, saga_body, parsed, entries)
            except ApiException as error:
                entry = getattr(move, "entry", None)
                if error.status != 404 or entry is None:
                    raise
                # The entry was deleted while its call was being made: report it, go on.
                self.lose(entries.pop(entry.metadata.name), "deleted by hand while its call was in flight")
                written = saga_body
            for body in entries.values():  # what the move wrote is the newest copy
                self.engine.index.keep(body)
            # An event may have brought a newer copy while the write was in flight.
            saga_body = fresher(written, self.latest) or await ledger.saga(self.namespace, self.name)
            self.latest = saga_body

    async def entries(self, saga_body: Body) -> dict[str, Body]:
        """The saga's entries: from the index, or listed when compensating and the index cannot
        be shown to hold every entry written before the saga's current version (an agent's last
        entry and its abort may arrive on different watch streams in either order)."""
        index = self.engine.index
        key = (self.namespace, self.name)
        phase = saga_body.get("status", {}).get("phase")
        compensating = phase in ("Failed", "Compensating")
        if (
            self.verified
            or not compensating
            or index.complete_at(self.namespace, saga_body["metadata"]["resourceVersion"])
        ):
            self.verified = self.verified or compensating
            return index.of(key)
        listed = await self.engine.ledger.entries(self.namespace, self.name)
        uid = saga_body["metadata"]["uid"]
        for body in index.replace(key, listed):
            # Its deletion event may come after this saga is final: report it now (once, by name).
            if owned_by(body, uid) and body.get("status", {}).get("state", "Pending") not in lifo.SETTLED:
                self.lose(body, "deleted by hand")
        self.verified = True
        return index.of(key)

    # -- applying moves ----------------------------------------------------------------------

    async def apply(
        self, move: moves.Move, saga: Saga, saga_body: Body, parsed: list[UndoEntry], entries: dict[str, Body]
    ) -> Body:
        engine = self.engine
        ledger, timeline = engine.ledger, engine.timeline
        outputs = {e.spec.step: e.status.output for e in parsed}
        match move:
            case moves.Initialize():
                return await self.enter(saga_body, saga, parsed, "Active", "Started", "the operator took charge")
            case moves.SyncMetadata(labels=labels, finalizers=finalizers):
                return await ledger.write_saga_metadata(saga_body, labels=labels, finalizers=finalizers)
            case moves.UpdateDepth(stack_depth=depth):
                return await self.write_status(saga_body, saga.status.model_copy(update={"stack_depth": depth}))
            case moves.Transition(phase=phase, reason=reason, message=message, failed_step=failed_step):
                extra = {"failed_step": failed_step} if failed_step else {}
                return await self.enter(saga_body, saga, parsed, phase, reason, message, **extra)
            case moves.RegisterStep(position=position, step=step):
                body = await engine.forwarder.register(saga, position, step)
                entries[body["metadata"]["name"]] = body
                return await self.counted(saga_body, saga, entries)
            case moves.ExecuteStep(entry=entry, step=step):
                name = entry.metadata.name
                entries[name] = await engine.forwarder.execute(saga, saga_body, entries[name], step, outputs)
                return await self.counted(saga_body, saga, entries)
            case moves.MarkPivot():
                timeline.record(saga_body, "PivotCommitted", "the Pivot step committed: the saga only goes forward now")
                return await self.write_status(saga_body, saga.status.model_copy(update={"pivot_committed": True}))
            case moves.RefuseAbort(message=message):
                timeline.record(saga_body, "AbortRefused", message, warning=True)
                status = saga.status.model_copy(update={"reason": "AbortRefused", "message": message})
                return await self.write_status(saga_body, status)
            case moves.CompensateEntry(entry=entry):
                name = entry.metadata.name
                entries[name] = await engine.compensator.compensate(saga, saga_body, entries[name], outputs)
                return await self.counted(saga_body, saga, entries)
            case moves.DeliverEffect(effect=effect):
                delivered = await engine.forwarder.deliver(saga, saga_body, effect, outputs)
                return await self.write_status(saga_body, _with_effect(saga.status, delivered))
            case moves.Retry(request=request, resume=resume):
                return await self.retry(saga, saga_body, entries, request, resume)
            case moves.SkipEntry(entry=entry, reason=reason, resume=resume):
                name = entry.metadata.name
                skipped = await ledger.write_entry_status(entries[name], {"state": "Skipped", "skipReason": reason})
                entries[name] = await ledger.drop_annotation("undoentries", skipped, phases.SKIP_ANNOTATION)
                timeline.record(entries[name], "Skipped", f"skipped by a person: {reason}", warning=True)
                parsed = [UndoEntry.model_validate(e) for e in entries.values()]
                return await self.enter(saga_body, saga, parsed, resume, "EntrySkipped", f"{name} skipped: {reason}")
            case moves.RefuseAnnotation(entry=entry, key=key, message=message):
                timeline.record(saga_body, "AnnotationIgnored", message, warning=True)
                if entry is None:
                    return await ledger.drop_annotation("sagas", saga_body, key)
                name = entry.metadata.name
                entries[name] = await ledger.drop_annotation("undoentries", entries[name], key)
                return saga_body
        raise AssertionError(f"unhandled move {move!r}")

    async def report_lost(self, saga: Saga, saga_body: Body) -> Body:
        known = {e.name for e in saga.status.lost_entries}
        new = [e for e in self.lost if e.name not in known]
        self.lost = []
        if not new:
            return saga_body
        for entry in new:
            self.engine.timeline.record(
                saga_body,
                "EntryLost",
                f"{entry.name} (step {entry.step}) {entry.why} before it was compensated",
                warning=True,
            )
        status = saga.status.model_copy(update={"lost_entries": [*saga.status.lost_entries, *new]})
        return await self.write_status(saga_body, status)

    async def retry(
        self, saga: Saga, saga_body: Body, entries: dict[str, Body], request: str, resume: SagaPhase
    ) -> Body:
        """A person's retry: what failed goes back to Pending, and the saga resumes."""
        ledger = self.engine.ledger
        if resume == "Completed":
            effects = [
                e.model_copy(update={"state": "Pending"}) if e.state == "Failed" else e for e in saga.status.effects
            ]
            status = saga.status.model_copy(
                update={"effects": effects, "reason": "RetryRequested", "message": f"retry requested: {request}"}
            )
            saga_body = await self.write_status(saga_body, status)
        else:
            for name, body in list(entries.items()):
                entry = UndoEntry.model_validate(body)
                if resume == "Active" and entry.status.effect == "Failed" and entry.status.state != "Skipped":
                    entries[name] = await ledger.write_entry_status(body, {"effect": "Pending"})
                elif resume == "Compensating" and entry.status.state == "Failed":
                    entries[name] = await ledger.write_entry_status(body, {"state": "Pending", "retryCount": 0})
            parsed = [UndoEntry.model_validate(e) for e in entries.values()]
            # Retrying says the person dealt with the lost entries: the saga goes on without them.
            acknowledged = [e.model_copy(update={"acknowledged": True}) for e in saga.status.lost_entries]
            saga = saga.model_copy(update={"status": saga.status.model_copy(update={"lost_entries": acknowledged})})
            saga_body = await self.enter(
                saga_body, saga, parsed, resume, "RetryRequested", f"retry requested: {request}"
            )
        return await ledger.drop_annotation("sagas", saga_body, phases.RETRY_ANNOTATION)

    async def enter(
        self,
        saga_body: Body,
        saga: Saga,
        parsed: list[UndoEntry],
        phase: SagaPhase,
        reason: str,
        message: str,
        **extra: Any,
    ) -> Body:
        """Write the saga's new phase (conditions, counters), then post the Event."""
        status = phases.with_phase(
            saga.status, phase, reason=reason, message=message, now=utcnow(), generation=saga.metadata.generation
        )
        status = _with_counters(status, parsed).model_copy(update=extra)
        written = await self.write_status(saga_body, status)
        metrics.saga_transitions.labels(phase, reason).inc()
        self.engine.phase_seen(self.namespace, self.name, phase)
        warning = phase in ("Failed", "Halted")
        self.engine.timeline.record(written, phase, f"{reason}: {message}", warning=warning)
        return written

    async def counted(self, saga_body: Body, saga: Saga, entries: dict[str, Body]) -> Body:
        """Refresh stackDepth and compensatedCount after an entry moved, at most once per
        COUNTER_INTERVAL: fast sagas show their counts with the next phase, slow ones show
        progress (STEPS and UNDONE in `kubectl get sagas`) while they run."""
        if time.monotonic() - self.last_status_write < COUNTER_INTERVAL:
            return saga_body
        parsed = [UndoEntry.model_validate(e) for e in entries.values()]
        status = _with_counters(saga.status, parsed)
        if status == saga.status:
            return saga_body
        return await self.write_status(saga_body, status)

    async def write_status(self, saga_body: Body, status: SagaStatus) -> Body:
        written = await self.engine.ledger.write_saga_status(saga_body, status)
        self.last_status_write = time.monotonic()
        return written


def _with_counters(status: SagaStatus, entries: list[UndoEntry]) -> SagaStatus:
    return status.model_copy(update={"stack_depth": len(entries), "compensated_count": lifo.settled_count(entries)})


def _with_effect(status: SagaStatus, delivered: EffectStatus) -> SagaStatus:
    previous = next((e for e in status.effects if e.name == delivered.name), None)
    if previous is not None:
        delivered = delivered.model_copy(update={"attempts": previous.attempts + delivered.attempts})
    effects = [e for e in status.effects if e.name != delivered.name] + [delivered]
    return status.model_copy(update={"effects": effects})
