"""The drivers of every saga of one shard that needs work, fed by the shard's ordered watches of
Sagas and UndoEntries (label-selected on the server when there are several shards). Objects
are parsed once, here."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from undolog import metrics
from undolog.api import EventReason, ObjectMeta, Resource, Saga, SagaPhase, UndoEntry
from undolog.calls.runner import Fence, fence_this_task
from undolog.controller.archiving import Archiver
from undolog.controller.compensation import Compensator
from undolog.controller.context import DriverContext, SagaSlots, Slot
from undolog.controller.driver import SagaDriver
from undolog.controller.driver_queue import DriverQueue
from undolog.controller.entry_index import EntryIndex, SagaKey
from undolog.controller.entry_losses import report_orphans
from undolog.controller.entry_proof import Listed
from undolog.controller.entry_watch import EntryEvent, EntryWatch
from undolog.controller.forward import Forwarder
from undolog.controller.gauges import SagaGauges
from undolog.controller.retention import Retention
from undolog.controller.seen_sagas import SeenSagas
from undolog.controller.shard_labels import ShardLabels, filed_in
from undolog.controller.storage_migration import StorageMigration
from undolog.controller.timeline import Timeline
from undolog.conventions import now
from undolog.decisions import compensation_plan, phases, resolutions, retention
from undolog.decisions.retention import RetentionPolicy
from undolog.decisions.sharding import Shard
from undolog.kube import Body, Kube
from undolog.kube.watch import OrderedWatch, Progress, as_body
from undolog.ledger import Ledger, Unreadable, UnreadableSaga, parse_saga

log = logging.getLogger("undolog.engine")


@dataclass
class Engine:
    kube: Kube
    ledger: Ledger
    compensator: Compensator
    forwarder: Forwarder
    timeline: Timeline
    fence: Fence
    namespaces: list[str] = field(default_factory=list)  # watched; empty: all
    shard: Shard = field(default_factory=lambda: Shard(0, 1))  # the sagas this engine drives
    slots: SagaSlots = field(default_factory=lambda: SagaSlots(200))  # shared by the shards
    labels: ShardLabels | None = None  # puts a wrong bucket label right (several shards)
    drivers: dict[SagaKey, SagaDriver] = field(default_factory=dict)
    gauges: SagaGauges = field(default_factory=SagaGauges)
    sagas: SeenSagas = field(init=False)
    leading: bool = False  # True once `lead` has indexed the entries (and holds the Lease)
    taking_charge: bool = False  # while `lead` hands over what it listed
    watches: list[asyncio.Task[None]] = field(default_factory=list)
    index: EntryIndex = field(default_factory=EntryIndex)
    entry_watches: dict[str | None, EntryWatch] = field(default_factory=dict)  # by namespace (None: all)
    listed_before_entries: dict[SagaKey, Listed] = field(default_factory=dict)  # while taking charge
    queued: DriverQueue = field(init=False)  # drivers waiting for a slot
    retention: Retention | None = None  # deletes the shard's finished sagas once due
    archiver: Archiver | None = None  # writes every finished saga to the archive
    storage: StorageMigration | None = None  # writes what an earlier release stored again, once
    context: DriverContext = field(init=False)

    def __post_init__(self) -> None:
        self.sagas = SeenSagas(self.gauges)
        self.queued = DriverQueue(self.slots, self._run, lambda driver: self.drivers.get(driver.key) is driver)
        self.context = DriverContext(
            ledger=self.ledger,
            timeline=self.timeline,
            index=self.index,
            compensator=self.compensator,
            forwarder=self.forwarder,
            slots=self.slots,
            phase_changed=self.phase_seen,
            fence=self.fence,
            entries_seen=self.entries_seen,
            retention=self.policy,
            finished=self.finished,
        )

    @property
    def policy(self) -> RetentionPolicy:
        return self.retention.policy if self.retention is not None else RetentionPolicy()

    def finished(self, saga: Saga, entries: list[UndoEntry]) -> None:
        """A driver let its saga go, finished: archived with the entries it holds."""
        record = retention.finished(saga, self.policy)
        if record is not None and self.archiver is not None:
            self.archiver.offer(record, (saga, entries))

    async def lead(self) -> None:
        """Start driving the shard's sagas (at start, or on taking its Lease): list its sagas,
        then index its entries with one consistent listing and follow both watches from there;
        pick up every saga that needs work (and every saga an entry says is owed something).
        With one shard, the entry listing proves the entries of whatever the saga listing shows
        (a failure, a commit), having been taken after it: no saga lists its own to resume."""
        targets: list[str | None] = [*self.namespaces] or [None]
        selector = self.shard.selector()
        in_shard = functools.partial(filed_in, self.shard, self.labels)
        self.entry_watches = {
            ns: EntryWatch(self.kube, self.index, self.entry_event, ns, selector, in_shard) for ns in targets
        }
        sagas = [
            OrderedWatch(
                self.kube, "sagas", ns, as_body, self.saga_event, self._sagas_relisted(ns), label_selector=selector
            )
            for ns in targets
        ]
        listed_at = now()
        saga_listings = [await watch.listing() for watch in sagas]
        unreadable = [u for watch in self.entry_watches.values() for u in await watch.sync()]
        if selector is None:  # a label-selected listing lacks an entry not labelled yet: no proof
            self.listed_before_entries = {
                (meta["namespace"], meta["name"]): Listed(meta["resourceVersion"], listed_at)
                for items in saga_listings
                for meta in (item["metadata"] for item in items)
            }
        self.leading = self.taking_charge = True
        metrics.holding(+1)
        try:
            for watch, items in zip(sagas, saga_listings, strict=True):
                watch.handed(items)
            self.watches = [
                *(
                    asyncio.create_task(w.run(), name=f"undo entries of {w.namespace or 'all'}")
                    for w in self.entry_watches.values()
                ),
                *(asyncio.create_task(w.run(), name=f"sagas of {w.namespace or 'all'}") for w in sagas),
            ]
            # The entries of a saga that has no driver yet may give it work (one registered late,
            # or one whose saga does not exist); a saga being driven has them already.
            for key in self.index.sagas():
                if key not in self.drivers:
                    for entry in self.index.of(key).values():
                        self.entry_event((entry, False))
            for event in unreadable:
                self.entry_event(event)
        finally:
            self.listed_before_entries = {}
            self.taking_charge = False
        for key in list(self.sagas):
            self._settled(key)
        if self.retention is not None:
            self.retention.start()
        if self.storage is not None:
            self.storage.start(self.namespaces, self.shard)

    async def follow(self) -> None:
        """Another replica drives the shard now (it picks up where this one stopped)."""
        if self.leading:
            metrics.holding(-1)
            for key in list(self.sagas):
                self._forget(key)
        self.leading = False
        await self.stop()
        self.sagas.clear()

    # -- events --------------------------------------------------------------------------------

    def saga_event(self, event_type: str | None, body: Body) -> None:
        """A Saga event of the shard's watch: parsed once, then handed to its driver."""
        key: SagaKey = (body["metadata"]["namespace"], body["metadata"]["name"])
        if not self.shard.owns(*key):  # labelled into this shard by hand: filed where it belongs
            if self.labels is not None:
                self.labels.file("sagas", *key, key[1])
            return
        if event_type == "DELETED":
            self._gone(key)
            return
        saga = parse_saga(body)
        if isinstance(saga, UnreadableSaga):  # the API took it, this version cannot use it: say so on it
            if self.leading:
                said_unreadable(self.timeline, body, saga.why)
            log.error("saga %s/%s cannot be read and is left alone: %s", *key, saga.why)
            return
        if self.leading:
            self.saga_seen(saga)

    def _gone(self, key: SagaKey) -> None:
        self._forget(key)
        if self.retention is not None:
            record = self.retention.finished.get(key)
            if record is not None and self.archiver is not None:
                self.archiver.forget(record.uid)
            self.retention.gone(key)
        self.index.forget(key)
        driver = self.drivers.get(key)
        if driver is not None:
            driver.notify(None)

    def _sagas_relisted(self, namespace: str | None) -> Callable[[list[Body]], None]:
        """A fresh listing of the shard's sagas: those held and no longer listed were deleted
        while no stream was open; every listed one is handled as a change."""

        def relisted(items: list[Body]) -> None:
            listed = {(item["metadata"]["namespace"], item["metadata"]["name"]) for item in items}
            for key in [k for k in self.sagas if namespace in (None, k[0]) and k not in listed]:
                self._gone(key)
            for item in items:
                self.saga_event("MODIFIED", item)

        return relisted

    def saga_seen(self, saga: Saga) -> None:
        key = saga.key
        if self.sagas.late(saga):  # as news, it started a driver holding no entries for a saga let go
            return
        self.phase_seen(saga)
        self.sagas[key].top_position = saga.status.top_position
        if self.retention is not None:
            self.retention.seen(saga)
        record = retention.finished(saga, self.policy) if self.archiver is not None else None
        if record is not None and self.archiver is not None:
            self.archiver.offer(record)
        driver = self.drivers.get(key)
        if driver is not None:
            driver.notify(saga)
        elif phases.needs_driver(saga):
            self._start(key).notify(saga)
        else:
            self._settled(key)

    def entry_event(self, event: EntryEvent) -> None:
        if isinstance(event, Unreadable):
            self._unreadable(event)
            return
        entry, deleted = event
        if not self.leading:
            return
        key: SagaKey = (entry.metadata.namespace, entry.spec.saga)
        if deleted:
            self._entry_deleted(key, entry)
            return
        driver = self.drivers.get(key)
        if driver is not None:
            driver.wake.set()
        elif self._gives_work(key, entry):
            self._start(key)
        else:  # the echo of a write made for a saga since settled: not kept
            self._settled(key)

    def _gives_work(self, key: SagaKey, entry: UndoEntry) -> bool:
        seen = self.sagas.get(key)
        if seen is None:  # no such saga known (yet): its driver finds out, and says so on the entry
            return phases.unclaimed(entry)
        if seen.phase == SagaPhase.COMPLETED:  # only an entry registered after the commit
            top = seen.top_position
            return top is not None and entry.spec.stack_position > top and phases.entry_needs_saga(entry)
        return phases.entry_needs_saga(entry)

    def _unreadable(self, event: Unreadable) -> None:
        key = (event.namespace, event.saga)
        if not self.leading or key not in self.sagas:
            return
        (self.drivers.get(key) or self._start(key)).lose(event.lost)

    def _entry_deleted(self, key: SagaKey, entry: UndoEntry) -> None:
        """An entry gone before it was compensated is reported on its saga, never skipped silently.
        (After a saga is deleted, the garbage collector removes its settled entries: no report.)"""
        seen = self.sagas.get(key)
        if entry.status.state in compensation_plan.SETTLED or seen is None or seen.phase in (None, *phases.TERMINAL):
            return
        (self.drivers.get(key) or self._start(key)).vanish(entry)

    # -- gauges -----------------------------------------------------------------------------------

    def phase_seen(self, saga: Saga) -> None:
        """The saga as last written or seen: its phase (and what it is halted on) in the gauges."""
        halted = saga.status.phase == SagaPhase.HALTED
        halted_on = resolutions.halted_on(saga, list(self.index.of(saga.key).values())) if halted else None
        self.sagas.moved(saga, halted_on, self.leading)

    def _forget(self, key: SagaKey) -> None:
        self.sagas.drop(key, self.leading)

    # -- drivers ----------------------------------------------------------------------------------

    def entries_seen(self, namespace: str) -> Progress | None:
        """How far the watch that shows every entry of `namespace` has come. None with several
        shards: an entry not labelled yet (applied by hand) is in no shard's watch."""
        if self.shard.selector() is not None:
            return None
        watch = self.entry_watches.get(namespace) or self.entry_watches.get(None)
        return None if watch is None else watch.progress

    def _start(self, key: SagaKey) -> SagaDriver:
        """A driver for the saga, run once a slot is free (it waits in the queue until then;
        what wakes it meanwhile is kept for it)."""
        driver = SagaDriver(self.context, *key)
        driver.listed = self.listed_before_entries.get(key)
        self.drivers[key] = driver
        self.queued.append(driver)
        return driver

    async def _run(self, driver: SagaDriver, slot: Slot) -> None:
        key = driver.key
        fence_this_task(self.fence)  # the calls the driver makes carry its shard's Lease
        try:
            await driver.run(slot)
            if not driver.seen_saga and key not in self.sagas:
                await report_orphans(self.context, key)
        finally:
            if self.drivers.get(key) is driver:
                del self.drivers[key]
                if key in self.sagas:
                    self.sagas[key].saw(driver.copy.revision)
                came_back = driver.latest
                if driver.quit_gone and not driver.gone and came_back is not None:  # seen again as it quit
                    self.saga_seen(came_back)
                else:
                    self._settled(key)

    def _settled(self, key: SagaKey) -> None:
        """A Completed or Compensated saga needs its entries no more (memory, with thousands of
        sagas): an entry that changes later comes back with its event, and a driver proves the
        rest anew."""
        seen = self.sagas.get(key)
        if seen is not None and seen.phase in phases.TERMINAL and key not in self.drivers and not self.taking_charge:
            self.index.forget(key)

    async def stop(self) -> None:
        """Stop driving and watching (a new `lead` lists afresh)."""
        if self.retention is not None:
            await self.retention.stop()
        if self.storage is not None:
            await self.storage.stop()
        tasks = [d.task for d in self.drivers.values() if d.task is not None] + self.watches + self.queued.stop()
        for task in tasks:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*tasks, return_exceptions=True)
        self.drivers.clear()
        self.watches.clear()
        self.entry_watches.clear()


def said_unreadable(timeline: Timeline, body: Body, why: str) -> None:
    """A Warning Event on a saga this operator cannot read: it is left alone until it can."""
    meta = body["metadata"]
    reference = Resource(
        kind="Saga", metadata=ObjectMeta(name=meta["name"], namespace=meta["namespace"], uid=meta.get("uid", ""))
    )
    timeline.record(
        reference,
        EventReason.SAGA_UNREADABLE,
        f"this operator cannot read the saga ({why}); it is left alone until it can",
        warning=True,
    )
