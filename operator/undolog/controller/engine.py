"""The engine of one shard: its ordered watches of Sagas and UndoEntries (label-selected on the
server when there are several shards), its Lease's lead and follow, and the concerns that
follow its sagas (controller/concerns.py: the drivers, retention, the archive, the gauges),
each handed every copy, deletion and finish; it routes nothing by name. Objects are parsed
once, here."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from undolog import metrics
from undolog.api import EventReason, ObjectMeta, Resource, Saga, UndoEntry
from undolog.api.common import revision_in
from undolog.calls.runner import Fence
from undolog.controller.archiving import ArchiveConcern, Archiver
from undolog.controller.compensation import Compensator
from undolog.controller.concerns import SagaConcern
from undolog.controller.context import DriverContext, SagaSlots
from undolog.controller.drivers import Drivers, ShardState
from undolog.controller.entry_index import EntryIndex, SagaKey
from undolog.controller.entry_proof import Listed
from undolog.controller.entry_watch import EntryWatch
from undolog.controller.forward import Forwarder
from undolog.controller.gauges import PhaseGauges, SagaGauges
from undolog.controller.retention import Retention
from undolog.controller.seen_sagas import SeenSagas
from undolog.controller.shard_labels import ShardLabels, filed_in
from undolog.controller.storage_migration import StorageMigration
from undolog.controller.timeline import Timeline
from undolog.conventions import CLUSTER_CLOCK, Clock
from undolog.decisions.retention import RetentionPolicy
from undolog.decisions.sharding import Shard
from undolog.kube import Body, Kube
from undolog.kube.watch import OrderedWatch, Progress, as_body
from undolog.ledger import Ledger, UnreadableSaga, parse_saga

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
    gauges: SagaGauges = field(default_factory=SagaGauges)  # shared by the shards
    index: EntryIndex = field(default_factory=EntryIndex)
    retention: Retention | None = None  # deletes the shard's finished sagas once due
    archiver: Archiver | None = None  # writes every finished saga to the archive (shared)
    storage: StorageMigration | None = None  # writes what an earlier release stored again, once
    clock: Clock = CLUSTER_CLOCK  # wall and monotonic time, for every part of the engine
    state: ShardState = field(init=False)
    context: DriverContext = field(init=False)
    drivers: Drivers = field(init=False)
    concerns: list[SagaConcern] = field(init=False)
    watches: list[asyncio.Task[None]] = field(default_factory=list)
    entry_watches: dict[str | None, EntryWatch] = field(default_factory=dict)  # by namespace (None: all)

    def __post_init__(self) -> None:
        self.state = ShardState(index=self.index)
        self.context = DriverContext(
            ledger=self.ledger,
            timeline=self.timeline,
            index=self.index,
            compensator=self.compensator,
            forwarder=self.forwarder,
            slots=self.slots,
            phase_changed=self.written,
            fence=self.fence,
            entries_seen=self.entries_seen,
            retention=self.retention.policy if self.retention is not None else RetentionPolicy(),
            finished=self.let_go,
            clock=self.clock,
        )
        self.drivers = Drivers(self.state, self.context, self.fence, self.saga_seen)
        self.concerns = [PhaseGauges(self.gauges, self.index), self.drivers]
        if self.retention is not None:
            self.concerns.append(self.retention)
        if self.archiver is not None:
            self.concerns.append(ArchiveConcern(self.archiver))

    @property
    def sagas(self) -> SeenSagas:
        return self.state.sagas

    @property
    def leading(self) -> bool:
        return self.state.leading

    @leading.setter
    def leading(self, leading: bool) -> None:
        self.state.leading = leading

    async def lead(self) -> None:
        """Start driving the shard's sagas (at start, or on taking its Lease): list its sagas,
        then index its entries with one consistent listing and follow both watches from there;
        pick up every saga that needs work (and every saga an entry says is owed something).
        With one shard, the entry listing proves the entries of whatever the saga listing shows
        (a failure, a commit), having been taken after it: no saga lists its own to resume."""
        targets: list[str | None] = [*self.namespaces] or [None]
        selector = self.shard.selector()
        in_shard = functools.partial(filed_in, self.shard, self.labels)
        events = self.drivers.entry_event
        self.entry_watches = {ns: EntryWatch(self.kube, self.index, events, ns, selector, in_shard) for ns in targets}
        sagas = [
            OrderedWatch(
                self.kube, "sagas", ns, as_body, self.saga_event, self._sagas_relisted(ns), label_selector=selector
            )
            for ns in targets
        ]
        listed_at = self.context.clock.now()
        saga_listings = [await watch.listing() for watch in sagas]
        unreadable = [u for watch in self.entry_watches.values() for u in await watch.sync()]
        state = self.state
        if selector is None:  # a label-selected listing lacks an entry not labelled yet: no proof
            state.listed_before_entries = {
                (meta["namespace"], meta["name"]): Listed(meta["resourceVersion"], listed_at)
                for items in saga_listings
                for meta in (item["metadata"] for item in items)
            }
        state.leading = state.taking_charge = True
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
                if key not in self.drivers.running:
                    for entry in self.index.of(key).values():
                        events((entry, False))
            for event in unreadable:
                events(event)
        finally:
            state.listed_before_entries = {}
            state.taking_charge = False
        for key in list(state.sagas):
            self.drivers.settled(key)
        if self.retention is not None:
            self.retention.start()
        if self.storage is not None:
            self.storage.start(self.namespaces, self.shard)

    async def follow(self) -> None:
        """Another replica drives the shard now (it picks up where this one stopped)."""
        if self.leading:
            metrics.holding(-1)
            for key in list(self.sagas):
                for concern in self.concerns:
                    concern.gone(key)
        self.leading = False
        await self.stop()
        self.sagas.clear()

    # -- the saga watch ------------------------------------------------------------------------

    def saga_event(self, event_type: str | None, body: Body) -> None:
        """A Saga event of the shard's watch: parsed once, then handed to every concern."""
        key: SagaKey = (body["metadata"]["namespace"], body["metadata"]["name"])
        if not self.shard.owns(*key):  # labelled into this shard by hand: filed where it belongs
            if self.labels is not None:
                self.labels.file("sagas", *key, key[1])
            return
        if event_type == "DELETED":
            self._gone(key)
            return
        if self.sagas.handed(key, revision_in(body)):
            return  # the echo of a copy every concern has (parsed, it was 5% of the operator's CPU)
        saga = parse_saga(body)
        if isinstance(saga, UnreadableSaga):  # the API took it, this version cannot use it: say so on it
            if self.leading:
                said_unreadable(self.timeline, body, saga.why)
            log.error("saga %s/%s cannot be read and is left alone: %s", *key, saga.why)
            return
        if self.leading:
            self.saga_seen(saga)

    def saga_seen(self, saga: Saga) -> None:
        if self.sagas.late(saga):  # as news, it started a driver holding no entries for a saga let go
            return
        self.sagas.saw(saga, handed=True)
        for concern in self.concerns:
            concern.seen(saga, written=False)

    def written(self, saga: Saga) -> None:
        """The saga as its driver just wrote it, in a new phase."""
        self.sagas.saw(saga, handed=self.leading)
        if self.leading:
            for concern in self.concerns:
                concern.seen(saga, written=True)

    def let_go(self, saga: Saga, entries: list[UndoEntry]) -> None:
        """A driver let its saga go, finished, with the entries it held."""
        self.sagas.saw(saga)
        for concern in self.concerns:
            concern.let_go(saga, entries)

    def _gone(self, key: SagaKey) -> None:
        self.sagas.pop(key, None)
        for concern in self.concerns:
            concern.gone(key)
        self.index.forget(key)

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

    def entries_seen(self, namespace: str) -> Progress | None:
        """How far the watch that shows every entry of `namespace` has come. None with several
        shards: an entry not labelled yet (applied by hand) is in no shard's watch."""
        if self.shard.selector() is not None:
            return None
        watch = self.entry_watches.get(namespace) or self.entry_watches.get(None)
        return None if watch is None else watch.progress

    async def stop(self) -> None:
        """Stop driving and watching (a new `lead` lists afresh)."""
        if self.retention is not None:
            await self.retention.stop()
        if self.storage is not None:
            await self.storage.stop()
        for task in self.watches:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*self.watches, return_exceptions=True)
        await self.drivers.stop()
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
