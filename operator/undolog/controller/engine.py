"""The drivers of every saga that needs work, fed by the watch events kopf delivers."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from dataclasses import dataclass, field

from undolog import metrics
from undolog.api.saga import Saga
from undolog.controller.compensation import Compensator
from undolog.controller.driver import SagaDriver
from undolog.controller.entry_index import EntryIndex
from undolog.controller.entry_watch import EntryWatch
from undolog.controller.forward import Forwarder
from undolog.controller.ledger import Ledger
from undolog.controller.timeline import Timeline
from undolog.decisions import lifo, phases
from undolog.kube import Body

SagaKey = tuple[str, str]


def needs_driver(saga: Saga) -> bool:
    """Work is (or may be) left: not final, a finalizer to release, a request to answer."""
    meta = saga.metadata
    return (
        saga.status.phase not in phases.TERMINAL
        or phases.FINALIZER in meta.finalizers
        or phases.RETRY_ANNOTATION in meta.annotations
        or phases.metadata_move(saga) is not None
    )


def entry_needs_saga(entry: Body) -> bool:
    """An entry event that may give its saga work: one still owed, or a person's annotation."""
    state = entry.get("status", {}).get("state", "Pending")
    annotations = entry["metadata"].get("annotations") or {}
    return state in ("Pending", "Running") or phases.SKIP_ANNOTATION in annotations


@dataclass
class Engine:
    ledger: Ledger
    compensator: Compensator
    forwarder: Forwarder
    timeline: Timeline
    drivers: dict[SagaKey, SagaDriver] = field(default_factory=dict)
    phases: dict[SagaKey, str] = field(default_factory=dict)
    phase_counts: Counter[str] = field(default_factory=Counter)
    namespaces: list[str] = field(default_factory=list)  # watched; empty: all
    leading: bool = False  # True once `lead` has indexed the entries (and, with HA, holds the Lease)
    max_concurrent: int = 200  # sagas reconciled at once; the others wait their turn
    slots: asyncio.Semaphore = field(init=False)
    index: EntryIndex = field(init=False)
    watches: list[asyncio.Task[None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.slots = asyncio.Semaphore(self.max_concurrent)
        self.index = EntryIndex(clusterwide=not self.namespaces)

    async def lead(self) -> None:
        """Start driving sagas (at start, or on taking the Lease): index every entry with one
        consistent listing and follow the entries' watch from there, then pick up every saga
        that needs work (and every saga an entry says is owed something)."""
        targets: list[str | None] = [*self.namespaces] or [None]
        watches = [EntryWatch(self.ledger.kube, self.index, self.entry_event, namespace) for namespace in targets]
        listed = [body for watch in watches for body in await watch.sync()]
        self.leading = True
        self.watches = [asyncio.create_task(w.run(), name=f"undo entries of {w.namespace or 'all'}") for w in watches]
        for namespace in targets:
            for body in await self.ledger.kube.list("sagas", namespace):
                self.saga_event(None, body)
        for body in listed:
            self.entry_event(None, body)

    async def follow(self) -> None:
        """Another operator leads: stop driving (it picks up where this one stopped)."""
        self.leading = False
        await self.stop()

    def saga_event(self, event_type: str | None, body: Body) -> None:
        key: SagaKey = (body["metadata"]["namespace"], body["metadata"]["name"])
        if event_type == "DELETED":
            self._forget(key)
            self.index.forget(key)
            driver = self.drivers.get(key)
            if driver is not None:
                driver.notify(None)
            return
        self.phase_seen(*key, body.get("status", {}).get("phase") or "New")
        if not self.leading:
            return
        driver = self.drivers.get(key)
        if driver is not None:
            driver.notify(body)
        elif needs_driver(Saga.model_validate(body)):
            self._start(key, body)

    def entry_event(self, event_type: str | None, body: Body) -> None:
        key: SagaKey = (body["metadata"]["namespace"], body["spec"]["saga"])
        self.index.watched(body, deleted=event_type == "DELETED")  # trimmed by the adapter
        if not self.leading:
            return
        if event_type == "DELETED":
            self._entry_deleted(key, body)
            return
        driver = self.drivers.get(key)
        if driver is not None:
            driver.wake.set()
        elif self.phases.get(key) != "Completed" and entry_needs_saga(body):
            self._start(key, None)

    def _entry_deleted(self, key: SagaKey, body: Body) -> None:
        """An entry gone before it was compensated is reported on its saga, never skipped silently.
        (After a saga is deleted, the garbage collector removes its settled entries: no report.)"""
        state = body.get("status", {}).get("state", "Pending")
        if state in lifo.SETTLED or self.phases.get(key) in (None, *phases.TERMINAL):
            return
        driver = self.drivers.get(key)
        if driver is None:
            self._start(key, None)
            driver = self.drivers[key]
        driver.lose(body, "deleted by hand")

    def phase_seen(self, namespace: str, name: str, phase: str) -> None:
        before = self.phases.get((namespace, name))
        if before != phase:
            self.phases[(namespace, name)] = phase
            self._count(before, phase)

    def _forget(self, key: SagaKey) -> None:
        self._count(self.phases.pop(key, None), None)

    def _count(self, before: str | None, after: str | None) -> None:
        for phase, change in ((before, -1), (after, 1)):
            if phase is not None:
                self.phase_counts[phase] += change
                metrics.sagas_by_phase.labels(phase).set(self.phase_counts[phase])
        metrics.halted_sagas.set(self.phase_counts["Halted"])

    def _start(self, key: SagaKey, body: Body | None) -> None:
        driver = SagaDriver(self, *key)
        if body is not None:
            driver.notify(body)
        self.drivers[key] = driver
        driver.task = asyncio.create_task(self._run(key, driver), name=f"saga {key[0]}/{key[1]}")

    async def _run(self, key: SagaKey, driver: SagaDriver) -> None:
        try:
            await driver.run()
        finally:
            if self.drivers.get(key) is driver:
                del self.drivers[key]

    async def stop(self) -> None:
        """Stop driving and watching (a new `lead` lists afresh)."""
        tasks = [d.task for d in self.drivers.values() if d.task is not None] + self.watches
        for task in tasks:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*tasks, return_exceptions=True)
        self.drivers.clear()
        self.watches.clear()
