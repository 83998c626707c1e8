"""A finished saga reaches the archive whole: every entry its status counts, whichever copy of
the saga and whichever driver offered it (PostgreSQL away, so nothing is written meanwhile)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.support.waiting import eventually
from tests.unit.operator.harness import NS, Operator
from undolog.api import Saga
from undolog.archive import ArchiveStore, ArchiveUnavailable
from undolog.controller.archiving import Archiver, NotWhole
from undolog.controller.engine import Engine
from undolog.conventions import FINALIZER, timestamp
from undolog.decisions import retention
from undolog.kube import Body

NOW = timestamp()


class AwayStore(ArchiveStore):
    """PostgreSQL killed: every request refused, nothing written."""

    def __init__(self) -> None:
        super().__init__("host=127.0.0.1 port=9 dbname=none")

    async def revisions(self, uids: Any) -> Any:
        raise ArchiveUnavailable("the archive cannot be reached")

    async def write(self, sagas: Any, events: Any) -> Any:
        raise ArchiveUnavailable("the archive cannot be reached")


async def finished(operator: Operator, engine: Engine, name: str) -> Body:
    """The saga driven until its driver let it go, finished (finalizer released)."""
    engine.informer.saga_event("MODIFIED", operator.kube.body("sagas", NS, name))

    async def settled() -> Body | None:
        body = operator.kube.body("sagas", NS, name)
        return None if engine.drivers.running or FINALIZER in body["metadata"].get("finalizers", []) else body

    released = await eventually(settled, lambda body: body is not None, 5, f"saga {name} finished")
    assert released is not None
    return released


async def test_a_late_copy_of_a_finished_saga_never_replaces_its_entries_with_none(operator: Operator) -> None:
    """The watch, behind under load, hands over the saga's Completed copy (finalizer still held)
    after its driver has released the finalizer and let the saga go (and its entries with it).
    That copy started a second driver holding no entries; its release lost to the newer copy
    (409, "deciding again"), it found the saga finished, and offered it to the archive with the
    entries it held: none. While PostgreSQL was away that offer replaced the whole one."""
    saga = operator.saga("s", outcome="Commit")
    for position in (1, 2, 3):
        operator.entry(saga, position)
    archiver = Archiver(AwayStore(), operator.context.ledger)
    engine = operator.engine(index=operator.context.index, archiver=archiver)
    released = await finished(operator, engine, "s")
    uid = released["metadata"]["uid"]
    assert released["status"]["phase"] == "Completed"
    late = copy.deepcopy(released)  # the Completed copy, before the release's write
    late["metadata"]["finalizers"] = [FINALIZER]
    late["metadata"]["resourceVersion"] = str(int(released["metadata"]["resourceVersion"]) - 1)
    engine.informer.saga_event("MODIFIED", late)
    assert engine.drivers.running == {}, "a late copy started a driver for a saga already let go"
    await eventually(lambda: idle(engine), bool, 5, "no driver left")
    held = archiver.waiting[uid].held
    assert held is not None
    assert sorted(e.spec.stack_position for e in held[1]) == [1, 2, 3]
    await engine.stop()


async def idle(engine: Engine) -> bool:
    return not engine.drivers.running


async def test_entries_a_driver_held_that_are_not_all_of_them_are_listed_instead(operator: Operator) -> None:
    saga = operator.saga("s", phase="Completed", outcome="Commit")
    for position in (1, 2):
        operator.entry(saga, position)
    await operator.kube.patch("sagas", NS, "s", {"metadata": {"finalizers": None}})
    done = operator.kube.patch_status("sagas", NS, "s", {"status": {"stackDepth": 2, "completionTime": NOW}})
    finished_saga = Saga.model_validate(await done)
    record = retention.finished(finished_saga)
    assert record is not None
    archiver = Archiver(AwayStore(), operator.context.ledger)
    archiver.offer(record, (finished_saga, []))  # what a driver that held none would offer
    whole = await archiver.record_of(archiver.waiting[record.uid], None)
    assert whole is not None
    assert [e["spec"]["stackPosition"] for e in whole.entries] == [1, 2]
    operator.kube.objects.pop(("undoentries", NS, "s-2"))  # deleted by hand after the saga finished
    with pytest.raises(NotWhole, match=r"1 entries where its status\.stackDepth says 2"):
        await archiver.record_of(archiver.waiting[record.uid], None)
