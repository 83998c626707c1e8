"""The proof that a saga's entries are all known, from the cheapest source that gives it."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from tests.support.waiting import eventually
from tests.unit.operator.harness import NS, Operator
from undolog.api import (
    EntryState,
    UndoEntry,
)
from undolog.calls.transport import PreparedCall
from undolog.controller import entry_proof
from undolog.controller.driver import SagaDriver
from undolog.controller.entry_proof import Listed
from undolog.conventions import now
from undolog.kube import Body, Plural
from undolog.kube.watch import Progress
from undolog.ledger import EntryWrites


async def test_the_entry_watch_past_the_last_write_proves_the_saga_compensated_without_a_second_list(
    operator: Operator,
) -> None:
    operator.watch_showing_entry_writes()
    operator.aborted("s", 3)
    done = await operator.drive("s")
    assert done.status.phase == "Compensated"
    assert operator.undone() == [3, 2, 1]
    assert operator.entry_lists() == 1  # before the first call only


async def test_a_watch_that_does_not_reach_the_last_write_is_not_taken_as_proof(
    operator: Operator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The watch is stuck (an outage) while an entry is registered during the compensation: the
    driver lists instead, finds it and compensates it before the saga is done."""
    monkeypatch.setattr(entry_proof, "WATCH_PROOF_WAIT", 0.05)
    operator.shard.watched = Progress()
    saga = operator.aborted("s", 1)

    def register_late(call: PreparedCall) -> None:
        if not operator.transport.sent[:-1]:
            operator.entry(saga, 2, indexed=False)

    operator.transport.on_send = register_late
    done = await operator.drive("s")
    assert done.status.phase == "Compensated"
    assert sorted(operator.undone()) == [1, 2]
    assert operator.entry_lists() == 3  # before the first call, then twice more before Compensated


async def test_another_sagas_entry_write_echoed_by_the_watch_proves_before_a_slow_list(
    operator: Operator,
) -> None:
    """Sagas failing together: their LISTs wait for the apiserver's cache (up to 100 ms), while
    another saga's call outcome, written after this saga's proof began, comes back on the entry
    watch within milliseconds. Its echo proves the entries as a LIST sent then would: the first
    compensation leaves while the LIST is still unanswered."""
    operator.watch_showing_entry_writes()
    other = operator.saga("other", outcome="Abort")
    written = UndoEntry.model_validate(operator.entry(other, 1))
    saga = operator.saga("s", outcome="Abort")
    for position in (1, 2):
        operator.entry(saga, position)
    answer = asyncio.Event()
    plain = operator.kube.list

    async def slow_list(plural: Plural, namespace: str | None = None, **selectors: Any) -> list[Body]:
        listed = await plain(plural, namespace, **selectors)  # what the apiserver had when asked
        await answer.wait()
        return listed

    operator.kube.list = slow_list  # type: ignore[method-assign]
    driving = asyncio.create_task(operator.drive("s"))

    async def lists() -> int:
        return operator.entry_lists()

    async def undone() -> list[int]:
        return operator.undone()

    await eventually(lists, lambda sent: sent == 1, 5, "the proof's LIST sent")
    assert operator.transport.sent == []  # nothing leaves before a proof
    ledger = operator.context.ledger
    await ledger.write_entry_status(written, written.status.model_copy(update={"state": EntryState.RUNNING}))
    called = await eventually(undone, bool, 5, "a compensation called")
    assert called[0] == 2  # newest first, while the LIST is still unanswered
    answer.set()  # the LIST answers at last, and nobody reads it
    done = await driving
    assert done.status.phase == "Compensated"
    assert operator.undone() == [2, 1]


async def test_an_entry_write_sent_before_the_proof_began_proves_nothing() -> None:
    """Only a write sent after the mark comes after every write acknowledged before it; one
    already on its way when the proof began may carry a revision below an entry registered
    meanwhile. A write in another namespace is in another watch's stream."""
    writes = EntryWrites()
    sent_early = asyncio.Event()

    async def answered(version: str, gate: asyncio.Event | None = None) -> Body:
        if gate is not None:
            await gate.wait()
        return {"metadata": {"resourceVersion": version}}

    early = asyncio.create_task(writes.written(NS, answered("5", sent_early)))
    await asyncio.sleep(0)  # on its way
    waiting = asyncio.create_task(writes.next_after(writes.mark(), NS))
    sent_early.set()
    await early
    await writes.written("elsewhere", answered("6"))
    await asyncio.sleep(0)
    assert not waiting.done()
    await writes.written(NS, answered("7"))
    assert await waiting == 7


async def test_the_listing_taken_on_taking_charge_proves_the_copy_listed_before_it(operator: Operator) -> None:
    operator.watch_showing_entry_writes()
    saga = operator.saga("s", outcome="Abort")
    for position in (1, 2):
        operator.entry(saga, position)
    done = await operator.drive("s", listed=saga)
    assert done.status.phase == "Compensated"
    assert operator.undone() == [2, 1]
    assert operator.entry_lists() == 0


async def test_a_saga_aborted_before_its_first_status_is_resumed_without_a_list_or_an_active_write(
    operator: Operator,
) -> None:
    operator.watch_showing_entry_writes()
    saga = operator.saga("s", phase=None, outcome="Abort")  # aborted while no operator ran
    for position in (1, 2, 3):
        operator.entry(saga, position)
    phases_written: list[str] = []
    plain = operator.kube.patch_status

    async def recorded(plural: Plural, namespace: str, name: str, patch: Body) -> Body:
        if plural == "sagas":
            phases_written.append(patch["status"]["phase"])
        return await plain(plural, namespace, name, patch)

    operator.kube.patch_status = recorded  # type: ignore[method-assign]
    done = await operator.drive("s", listed=saga)
    assert done.status.phase == "Compensated"
    assert done.status.start_time == done.metadata.creation_timestamp
    assert operator.undone() == [3, 2, 1]
    assert phases_written == ["Compensating", "Compensated"]
    assert operator.entry_lists() == 0


async def test_the_finalizer_written_on_the_listed_copy_keeps_the_listing_as_proof(operator: Operator) -> None:
    """A saga aborted before any operator saw it has no finalizer: the one written on it
    changes nothing the listing proved (written on condition of the listed copy)."""
    operator.watch_showing_entry_writes()
    saga = operator.saga("s", phase=None, outcome="Abort")
    saga["metadata"]["finalizers"] = []
    saga = operator.kube.put("sagas", saga)
    operator.entry(saga, 1)
    driver = SagaDriver(operator.context, NS, "s")
    driver.listed = Listed(saga["metadata"]["resourceVersion"], now())
    await driver.reconcile()
    assert operator.kube.body("sagas", NS, "s")["status"]["phase"] == "Compensated"
    assert operator.entry_lists() == 0


async def test_a_deadline_passed_after_the_listing_is_proven_by_a_list_of_its_own(operator: Operator) -> None:
    operator.watch_showing_entry_writes()
    saga = operator.saga("s", activeDeadlineSeconds=1)
    created = now() - timedelta(seconds=10)
    saga["metadata"]["creationTimestamp"] = created.isoformat()
    saga = operator.kube.put("sagas", saga)
    operator.entry(saga, 1)
    driver = SagaDriver(operator.context, NS, "s")
    driver.listed = Listed(saga["metadata"]["resourceVersion"], created + timedelta(seconds=0.5))  # before it
    await driver.reconcile()
    assert operator.kube.body("sagas", NS, "s")["status"]["phase"] == "Compensated"
    assert operator.entry_lists() == 1


async def test_a_failure_newer_than_the_listed_copy_is_proven_by_a_list_of_its_own(operator: Operator) -> None:
    listed = operator.saga("s")
    operator.watch_showing_entry_writes()
    operator.entry(listed, 1)
    aborted = operator.kube.put("sagas", {**listed, "spec": {**listed["spec"], "outcome": "Abort"}})  # since
    operator.entry(aborted, 2, indexed=False)  # not delivered yet: only a LIST shows it
    await operator.drive("s", listed=listed)
    assert operator.undone() == [2, 1]
    assert operator.entry_lists() == 1
