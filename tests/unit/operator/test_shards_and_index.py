"""Shards and the entry index: objects filed where they belong, finished sagas' entries let go."""

from __future__ import annotations

import copy

from tests.support.fakes import FakeKube
from tests.support.waiting import eventually
from tests.unit.operator.harness import NS, Operator
from undolog.api import (
    Saga,
    UndoEntry,
)
from undolog.controller.entry_watch import EntryEvent
from undolog.controller.shard_handler import ShardHandler
from undolog.controller.shard_labels import ShardLabels, filed_in
from undolog.conventions import BUCKET_LABEL, PHASE_LABEL, bucket_of
from undolog.decisions.sharding import Shard
from undolog.kube import Plural
from undolog.ledger import Unreadable


async def until_filed(kube: FakeKube, objects: list[tuple[Plural, str]], bucket: str) -> None:
    async def filed() -> bool:
        return all(kube.body(p, NS, n)["metadata"]["labels"].get(BUCKET_LABEL) == bucket for p, n in objects)

    await eventually(filed, lambda done: done, 5, "the bucket labels put right")


async def test_a_saga_and_entry_labelled_into_the_wrong_shard_are_filed_where_they_belong_not_driven(
    operator: Operator,
) -> None:
    """A bucket label edited by hand would put a saga in a shard whose replica lists it, while its
    entries (labelled by the SDK) are in another: that replica leaves it alone and puts the
    label right, so the replica of its real shard drives it with its entries."""
    name = next(n for n in (f"s{i}" for i in range(100)) if Shard(1, 2).owns(NS, n))
    saga = operator.saga(name, outcome="Abort")
    saga["metadata"]["labels"][BUCKET_LABEL] = str(Shard(0, 2).buckets[0])
    entry = operator.entry(saga, 1, indexed=False)
    engine = operator.engine(shard=Shard(0, 2), labels=ShardLabels(operator.context.ledger))
    engine.informer.saga_event("MODIFIED", saga)
    assert not filed_in(engine.informer.shard, engine.informer.labels, UndoEntry.model_validate(entry))
    assert engine.drivers.running == {}
    await until_filed(operator.kube, [("sagas", name), ("undoentries", f"{name}-1")], str(bucket_of(NS, name)))
    assert operator.transport.sent == []


async def test_the_entries_of_a_finished_saga_are_let_go_until_one_changes(operator: Operator) -> None:
    """Memory: a Compensated saga's entries leave the index (a late one brings its saga back)."""
    saga = operator.saga("s", phase="Compensated")
    saga["metadata"].update(finalizers=[], labels={PHASE_LABEL: "compensated"})
    operator.entry(saga, 1, state="Compensated")
    engine = operator.engine(index=operator.context.index)
    engine.informer.saga_event("MODIFIED", saga)
    assert engine.informer.index.of((NS, "s")) == {}
    assert engine.drivers.running == {}
    # The watch's echo of an entry write made before the saga settled, arriving after it did.
    echo = UndoEntry.model_validate(operator.kube.body("undoentries", NS, "s-1"))
    engine.informer.index.keep(echo)
    engine.drivers.entry_seen((echo, False))
    assert engine.informer.index.of((NS, "s")) == {}
    late = UndoEntry.model_validate(operator.entry(saga, 2))
    engine.drivers.entry_seen((late, False))
    assert (NS, "s") in engine.drivers.running
    await engine.stop()


async def test_the_echo_of_a_phase_its_driver_wrote_is_not_handed_out_again(operator: Operator) -> None:
    """Every subscriber is handed a driver's phase write as the API answered it (informer.written); the
    watch's echo of that very copy is neither parsed nor handed out again (it woke the driver for a
    reconcile that decided nothing). A newer copy is, and so is a copy of another saga."""
    body = operator.saga("s", phase="Compensated")
    other = operator.saga("t", phase="Compensated")
    engine = operator.engine()
    handed: list[tuple[str, str, bool]] = []

    class Spy(ShardHandler):
        def saga_seen(self, saga: Saga, *, written: bool) -> None:
            handed.append((saga.metadata.name, saga.metadata.resource_version, written))

    engine.informer.subscribe(Spy())
    engine.informer.written(Saga.model_validate(body))
    engine.informer.saga_event("MODIFIED", copy.deepcopy(body))  # its echo
    newer = copy.deepcopy(body)
    newer["metadata"]["resourceVersion"] = version = str(int(body["metadata"]["resourceVersion"]) + 1)
    engine.informer.saga_event("MODIFIED", newer)
    engine.informer.saga_event("MODIFIED", other)
    rv = body["metadata"]["resourceVersion"]
    assert handed == [("s", rv, True), ("s", version, False), ("t", other["metadata"]["resourceVersion"], False)]
    await engine.stop()


async def test_entry_events_reach_every_subscriber_while_the_shard_is_led_and_the_runnables_stop_newest_first(
    operator: Operator,
) -> None:
    """An entry event goes to whoever subscribed, as a saga event does, and to nobody while the
    shard is not led (its listing is being taken). What runs while leading starts in the order
    it was registered and stops newest first."""
    saga = operator.saga("s", outcome="Abort")
    entry = UndoEntry.model_validate(operator.entry(saga, 1))
    engine = operator.engine()
    heard: list[str] = []
    order: list[str] = []

    class Listener(ShardHandler):
        def entry_seen(self, event: EntryEvent) -> None:
            assert not isinstance(event, Unreadable)
            heard.append(event[0].metadata.name)

    class Part:
        def __init__(self, name: str) -> None:
            self.name = name

        def start(self) -> None:
            order.append(f"start {self.name}")

        async def stop(self) -> None:
            order.append(f"stop {self.name}")

    engine.informer.subscribe(Listener())
    engine.informer.state.leading = False
    engine.informer.entry_event((entry, False))
    assert heard == []
    engine.informer.state.leading = True
    engine.informer.entry_event((entry, False))
    assert heard == ["s-1"]
    engine.runnables.register(Part("a"))
    engine.runnables.register(Part("b"))
    engine.runnables.start()
    await engine.stop()
    assert order == ["start a", "start b", "stop b", "stop a"]
