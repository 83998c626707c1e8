"""Kubernetes Events for every transition and every call attempt, so `kubectl describe saga`
reads as a timeline. Posted from a bounded queue by a few workers: a slow or failing Events
API never slows compensation down, and a full queue drops (and logs) rather than blocks.
Names are <object>.<hex nanoseconds>, as client-go names them, so listings follow the timeline
even within one second (Event timestamps only keep seconds)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from undolog import errors
from undolog.api import EntryReason, EventReason, Resource, SagaPhase
from undolog.conventions import now
from undolog.kube import Body

Reason = EventReason | SagaPhase | EntryReason  # an entry reason: a call refused before sending

log = logging.getLogger("undolog.timeline")
WORKERS = 4


class EventSink(Protocol):
    """Where Events go (undolog.kube.Kube; a fake in unit tests)."""

    async def emit_event(
        self, regarding: Body, *, reason: str, message: str, warning: bool, at: datetime, name: str
    ) -> None: ...


@dataclass(frozen=True)
class Event:
    regarding: Body
    reason: Reason
    message: str
    warning: bool
    at: datetime  # when it happened, not when it was posted
    sequence: int  # nanoseconds, strictly increasing: event names sort in the order things happened


class Capture(Protocol):
    """Where every Event also goes as it is emitted, quiet ones included (the archive)."""

    def __call__(
        self, regarding: Resource, reason: str, message: str, warning: bool, at: datetime, sequence: int
    ) -> None: ...


class Timeline:
    def __init__(
        self,
        sink: EventSink,
        capacity: int = 10_000,
        *,
        quiet: frozenset[Reason] = frozenset(),
        capture: Capture | None = None,
    ) -> None:
        """`quiet`: reasons only logged, not posted (Normal successes the status already holds)."""
        self._sink = sink
        self._quiet = quiet
        self.capture = capture
        self._queue: asyncio.Queue[Event] = asyncio.Queue(capacity)
        self._workers: list[asyncio.Task[None]] = []
        self._last_sequence = 0

    def start(self) -> None:
        self._workers = [asyncio.create_task(self._post(), name=f"timeline-{i}") for i in range(WORKERS)]

    def record(
        self, regarding: Resource, reason: Reason, message: str, *, warning: bool = False, at: datetime | None = None
    ) -> None:
        """An Event about `regarding`, at `at` (when it happened, if not now)."""
        meta = regarding.metadata
        # Only what an Event points at: a backed-up queue must not hold whole objects.
        reference = {
            "apiVersion": regarding.api_version,
            "kind": regarding.kind,
            "metadata": {
                "name": meta.name,
                "namespace": meta.namespace,
                "uid": meta.uid,
                "resourceVersion": meta.resource_version,
            },
        }
        level = logging.WARNING if warning else logging.INFO
        log.log(level, "%s %s: %s: %s", regarding.kind, regarding.reference, reason, message)
        self._last_sequence = max(time.time_ns(), self._last_sequence + 1)
        at = at or now()
        if self.capture is not None:
            self.capture(regarding, reason, message, warning, at, self._last_sequence)
        if reason in self._quiet and not warning:
            return
        try:
            self._queue.put_nowait(Event(reference, reason, message, warning, at, self._last_sequence))
        except asyncio.QueueFull:
            log.warning("event queue full; dropped %s event for %s", reason, meta.name)

    async def stop(self, drain_seconds: float = 5.0) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._queue.join(), drain_seconds)
        for worker in self._workers:
            worker.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)

    async def _post(self) -> None:
        while True:
            event = await self._queue.get()
            try:
                await self._sink.emit_event(
                    event.regarding,
                    reason=event.reason,
                    message=event.message,
                    warning=event.warning,
                    at=event.at,
                    name=f"{event.regarding['metadata']['name']}.{event.sequence:x}",
                )
            except errors.KubeError as error:  # an Event is best effort; the objects hold the truth
                log.debug("could not post event %s: %s", event.reason, error.message)
            except Exception:  # a bug: say so, and keep posting the others
                log.exception("posting event %s failed", event.reason)
            finally:
                self._queue.task_done()
