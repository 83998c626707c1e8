"""One shard's sagas and entries as the operator sees them: an ordered watch per resource (and
watched namespace), label-selected on the server when there are several shards; each object
parsed once, the echo of the operator's own writes filtered once, and every copy, deletion and
finish handed to whatever subscribed (the drivers, retention, the archive, the gauges). The
drivers publish their own writes through it, so every subscriber sees them as it sees the
watch's copies."""

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
from undolog.controller.entry_index import EntryIndex, SagaKey
from undolog.controller.entry_proof import Listed
from undolog.controller.entry_watch import EntryEvent, EntryWatch
from undolog.controller.seen_sagas import SeenSagas
from undolog.controller.shard_handler import ShardHandler
from undolog.controller.shard_labels import ShardLabels, filed_in
from undolog.controller.timeline import Timeline
from undolog.conventions import CLUSTER_CLOCK, Clock
from undolog.decisions.sharding import Shard
from undolog.kube import Body, Kube
from undolog.kube.watch import OrderedWatch, Progress, as_body
from undolog.ledger import UnreadableSaga, parse_saga

log = logging.getLogger("undolog.informer")


@dataclass
class ShardState:
    """What the informer of a shard holds and its subscribers read: its sagas as last seen and
    its entries (the watch's index)."""

    index: EntryIndex = field(default_factory=EntryIndex)
    sagas: SeenSagas = field(default_factory=SeenSagas)
    leading: bool = False  # True once the entries are indexed (and the Lease is held)


@dataclass
class ShardInformer:
    kube: Kube
    timeline: Timeline  # says on a saga that this operator cannot read it
    namespaces: list[str] = field(default_factory=list)  # watched; empty: all
    shard: Shard = field(default_factory=lambda: Shard(0, 1))
    labels: ShardLabels | None = None  # puts a wrong bucket label right (several shards)
    state: ShardState = field(default_factory=ShardState)
    clock: Clock = CLUSTER_CLOCK
    handlers: list[ShardHandler] = field(default_factory=list)
    watches: list[asyncio.Task[None]] = field(default_factory=list)
    entry_watches: dict[str | None, EntryWatch] = field(default_factory=dict)  # by namespace (None: all)

    def subscribe(self, handler: ShardHandler) -> None:
        self.handlers.append(handler)

    @property
    def sagas(self) -> SeenSagas:
        return self.state.sagas

    @property
    def index(self) -> EntryIndex:
        return self.state.index

    async def take_charge(self) -> None:
        """List the shard's sagas, then index its entries with one consistent listing, hand both
        over and follow both watches from there. With one shard, the entry listing proves the
        entries of whatever the saga listing shows (a failure, a commit), having been taken after
        it: no saga lists its own to resume."""
        targets: list[str | None] = [*self.namespaces] or [None]
        selector = self.shard.selector()
        in_shard = functools.partial(filed_in, self.shard, self.labels)
        entry_event = self.entry_event
        self.entry_watches = {
            ns: EntryWatch(self.kube, self.index, entry_event, ns, selector, in_shard) for ns in targets
        }
        entry_watches = list(self.entry_watches.values())
        sagas = [
            OrderedWatch(self.kube, "sagas", ns, as_body, self.saga_event, self._relisted(ns), label_selector=selector)
            for ns in targets
        ]
        listed_at = self.clock.now()
        saga_listings = [await watch.listing() for watch in sagas]
        unreadable = [u for watch in entry_watches for u in await watch.sync()]
        listed: dict[SagaKey, Listed] = {}
        if selector is None:  # a label-selected listing lacks an entry not labelled yet: no proof
            listed = {
                (meta["namespace"], meta["name"]): Listed(meta["resourceVersion"], listed_at)
                for items in saga_listings
                for meta in (item["metadata"] for item in items)
            }
        for handler in self.handlers:
            handler.taking_charge(listed)
        self.state.leading = True
        metrics.holding(+1)
        for watch, items in zip(sagas, saga_listings, strict=True):
            watch.handed(items)
        self.watches = [
            *(asyncio.create_task(w.run(), name=f"undo entries of {w.namespace or 'all'}") for w in entry_watches),
            *(asyncio.create_task(w.run(), name=f"sagas of {w.namespace or 'all'}") for w in sagas),
        ]
        for event in unreadable:
            entry_event(event)
        for handler in self.handlers:
            handler.took_charge()

    def let_go(self) -> None:
        """Another replica drives the shard now: every subscriber is told each saga is gone."""
        if self.state.leading:
            metrics.holding(-1)
            for key in list(self.sagas):
                for handler in self.handlers:
                    handler.saga_gone(key)
        self.state.leading = False

    async def stop(self) -> None:
        """Stop watching (a new `take_charge` lists afresh)."""
        for task in self.watches:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*self.watches, return_exceptions=True)
        self.watches.clear()
        self.entry_watches.clear()

    # -- the watches -------------------------------------------------------------------------------

    def saga_event(self, event_type: str | None, body: Body) -> None:
        """A Saga event of the shard's watch: parsed once, then handed to every subscriber."""
        key: SagaKey = (body["metadata"]["namespace"], body["metadata"]["name"])
        if not self.shard.owns(*key):  # labelled into this shard by hand: filed where it belongs
            if self.labels is not None:
                self.labels.file("sagas", *key, key[1])
            return
        if event_type == "DELETED":
            self._gone(key)
            return
        if self.sagas.handed(key, revision_in(body)):
            return  # the echo of a copy every subscriber has (parsed, it was 5% of the operator's CPU)
        saga = parse_saga(body)
        if isinstance(saga, UnreadableSaga):  # the API took it, this version cannot use it: say so on it
            if self.state.leading:
                said_unreadable(self.timeline, body, saga.why)
            log.error("saga %s/%s cannot be read and is left alone: %s", *key, saga.why)
            return
        if self.state.leading:
            self.seen_again(saga)

    def entry_event(self, event: EntryEvent) -> None:
        """An entry event of the shard's watch, already applied to the index."""
        if self.state.leading:
            for handler in self.handlers:
                handler.entry_seen(event)

    def _gone(self, key: SagaKey) -> None:
        self.sagas.pop(key, None)
        for handler in self.handlers:
            handler.saga_gone(key)
        self.index.forget(key)

    def _relisted(self, namespace: str | None) -> Callable[[list[Body]], None]:
        """A fresh listing of the shard's sagas: those held and no longer listed were deleted
        while no stream was open; every listed one is handled as a change."""

        def relisted(items: list[Body]) -> None:
            listed = {(item["metadata"]["namespace"], item["metadata"]["name"]) for item in items}
            for key in [k for k in self.sagas if namespace in (None, k[0]) and k not in listed]:
                self._gone(key)
            for item in items:
                self.saga_event("MODIFIED", item)

        return relisted

    # -- what the drivers publish (controller/context.py's ShardFeed) -----------------------------

    def seen_again(self, saga: Saga) -> None:
        """A copy of the saga handed to every subscriber (a late one is not)."""
        if self.sagas.late(saga):  # as news, it started a driver holding no entries for a saga let go
            return
        self.sagas.saw(saga, handed=True)
        for handler in self.handlers:
            handler.saga_seen(saga, written=False)

    def written(self, saga: Saga) -> None:
        """The saga as its driver just wrote it, in a new phase."""
        leading = self.state.leading
        self.sagas.saw(saga, handed=leading)
        if leading:
            for handler in self.handlers:
                handler.saga_seen(saga, written=True)

    def finished(self, saga: Saga, entries: list[UndoEntry]) -> None:
        """A driver let its saga go, finished, with the entries it held."""
        self.sagas.saw(saga)
        for handler in self.handlers:
            handler.saga_finished(saga, entries)

    def entries_seen(self, namespace: str) -> Progress | None:
        """How far the watch that shows every entry of `namespace` has come. None with several
        shards: an entry not labelled yet (applied by hand) is in no shard's watch."""
        if self.shard.selector() is not None:
            return None
        watch = self.entry_watches.get(namespace) or self.entry_watches.get(None)
        return None if watch is None else watch.progress


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
