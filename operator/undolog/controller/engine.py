"""The engine of one shard: its informer (the ordered watches of its Sagas and UndoEntries and
whoever subscribed to them) and the parts that run only while this replica holds the shard's
Lease; `lead` and `follow` are what the Lease's election calls. `shard_engine` builds one,
subscribing each part that follows the shard's sagas and registering each that runs while
leading, once."""

from __future__ import annotations

from dataclasses import dataclass, field

from undolog.calls.runner import Fence
from undolog.controller.archiving import ArchiveFeed, Archiver
from undolog.controller.compensation import Compensator
from undolog.controller.context import DriverContext, SagaSlots
from undolog.controller.drivers import Drivers
from undolog.controller.entry_index import EntryIndex
from undolog.controller.forward import Forwarder
from undolog.controller.gauges import PhaseGauges, SagaGauges
from undolog.controller.informer import ShardInformer, ShardState
from undolog.controller.retention import Retention
from undolog.controller.runnables import LeaderRunnables
from undolog.controller.shard_labels import ShardLabels
from undolog.controller.storage_migration import StorageMigration
from undolog.controller.timeline import Timeline
from undolog.conventions import CLUSTER_CLOCK, Clock
from undolog.decisions.retention import RetentionPolicy
from undolog.decisions.sharding import Shard
from undolog.kube import Kube
from undolog.ledger import Ledger


@dataclass
class Engine:
    informer: ShardInformer
    drivers: Drivers  # the part that acts on the shard's sagas (subscribed, and run while leading)
    runnables: LeaderRunnables

    async def lead(self) -> None:
        """Start driving the shard's sagas (at start, or on taking its Lease)."""
        await self.informer.take_charge()
        self.runnables.start()

    async def follow(self) -> None:
        """Another replica drives the shard now (it picks up where this one stopped)."""
        self.informer.let_go()
        await self.stop()
        self.informer.sagas.clear()

    async def stop(self) -> None:
        """Stop watching, then what runs while leading (a new `lead` lists afresh)."""
        await self.informer.stop()
        await self.runnables.stop()


@dataclass
class ShardParts:
    """What one shard's engine is built of: the process's (controller/main.py) or a test's fakes."""

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


def shard_engine(parts: ShardParts) -> Engine:
    state = ShardState(index=parts.index)
    informer = ShardInformer(
        parts.kube, parts.timeline, parts.namespaces, parts.shard, parts.labels, state, parts.clock
    )
    context = DriverContext(
        ledger=parts.ledger,
        timeline=parts.timeline,
        index=parts.index,
        compensator=parts.compensator,
        forwarder=parts.forwarder,
        slots=parts.slots,
        informer=informer,
        fence=parts.fence,
        retention=parts.retention.policy if parts.retention is not None else RetentionPolicy(),
        clock=parts.clock,
    )
    drivers = Drivers(state, context, parts.fence)
    runnables = LeaderRunnables()
    informer.subscribe(PhaseGauges(parts.gauges, parts.index))
    informer.subscribe(drivers)
    runnables.register(drivers)
    if parts.retention is not None:
        informer.subscribe(parts.retention)
        runnables.register(parts.retention)
    if parts.archiver is not None:
        informer.subscribe(ArchiveFeed(parts.archiver))
        if parts.retention is not None:  # a deletion waiting for the archive goes once it commits
            parts.archiver.committed.append(parts.retention.archived)
    if parts.storage is not None:
        runnables.register(parts.storage)
    return Engine(informer, drivers, runnables)
