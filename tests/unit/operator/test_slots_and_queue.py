"""Saga slots and the queue of drivers waiting for one: fairness between namespaces, nothing lost."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.objects import entry_body
from tests.support.waiting import eventually
from tests.unit.operator.harness import NS, Operator
from undolog.api import Limits
from undolog.calls.pace import Pacing
from undolog.calls.transport import PreparedCall, Target
from undolog.controller.context import SagaSlots, Slot, without_slot
from undolog.controller.driver import SagaDriver
from undolog.decisions.retry import CallOutcome
from undolog.kube import Body, Plural


async def test_calls_made_together_give_up_and_take_back_one_slot() -> None:
    slots = SagaSlots(2)
    async with Slot(slots, NS):
        await asyncio.gather(
            without_slot(asyncio.sleep(0.01)), without_slot(asyncio.sleep(0.02))
        )  # two calls of one saga retrying
        assert slots.locked() is False  # it holds exactly one of the two
    await asyncio.wait_for(asyncio.gather(slots.acquire(NS), slots.acquire(NS)), 1)  # both free again: none leaked


async def test_no_more_sagas_wait_without_a_slot_than_the_bound_the_others_wait_in_theirs() -> None:
    """Each saga waiting without its slot is a live driver: unbounded, every saga waiting on a
    participant's outage or rate would be one, and memory would grow with them."""
    slots = SagaSlots(2, away=1)
    release = asyncio.Event()
    held: list[Slot] = []

    async def saga(name: str) -> None:
        async with Slot(slots, name) as slot:
            held.append(slot)
            await without_slot(release.wait())

    sagas = [asyncio.create_task(saga(name)) for name in ("a", "b", "c")]
    await eventually(lambda: _return(len(held)), lambda n: n == 3, 2, "three sagas started")
    assert [slot.held for slot in held] == [False, True, True]  # a stepped away; b and c wait in theirs
    assert (slots.free, slots.away_free) == (0, 0)
    release.set()
    await asyncio.wait_for(asyncio.gather(*sagas), 2)
    assert (slots.free, slots.away_free) == (2, 1)  # all given back


async def _return(value: int) -> int:
    return value


async def test_a_free_slot_goes_to_the_namespaces_in_turn_and_none_is_lost_to_a_cancelled_waiter() -> None:
    """Drivers of a busy namespace woken one after another (a change, a timer, a retry pause
    ending) asked the slots before another namespace's driver did: first come first served,
    that one waited behind all of them."""
    slots = SagaSlots(1)
    await slots.acquire("busy")
    order: list[str] = []

    async def take(namespace: str, tag: str) -> None:
        await slots.acquire(namespace)
        order.append(tag)

    waiting = [asyncio.create_task(take("busy", f"busy-{i}")) for i in range(3)]
    gone = asyncio.create_task(take("gone", "never"))
    waiting.append(asyncio.create_task(take("quiet", "quiet")))
    await asyncio.sleep(0)
    gone.cancel()
    for _ in range(4):
        slots.release()
        await asyncio.sleep(0)
    assert order == ["busy-0", "quiet", "busy-1", "busy-2"]
    late = asyncio.create_task(take("late", "late"))
    await asyncio.sleep(0)
    slots.release()  # busy-2's, granted to `late`, cancelled before it runs: the slot is free again
    late.cancel()
    await asyncio.gather(late, gone, return_exceptions=True)
    assert slots.free == 1
    await asyncio.gather(*waiting)


async def test_a_saga_waiting_to_retry_gives_its_slot_to_another(operator: Operator) -> None:
    """One slot; saga a's participant asks it to come back in 2 s. Meanwhile saga b, which
    needs the slot, is compensated: a waiting saga holds no slot."""
    operator.context.slots = SagaSlots(1)
    operator.webhook("slow")
    operator.transport.script("/slow", CallOutcome(status_code=429, error="HTTP 429", retry_after="2"))
    a = operator.saga("a", outcome="Abort")
    operator.entry(a, 1, compensation={"function": "slow"})
    b = operator.saga("b", outcome="Abort")
    operator.entry(b, 1)
    first_call = asyncio.Event()
    operator.transport.on_send = lambda call: first_call.set()
    waiting = asyncio.create_task(SagaDriver(operator.context, NS, "a").run())
    await asyncio.wait_for(first_call.wait(), timeout=5)
    began = asyncio.get_running_loop().time()
    await asyncio.wait_for(SagaDriver(operator.context, NS, "b").run(), timeout=1.5)
    assert asyncio.get_running_loop().time() - began < 1.5
    assert operator.kube.body("sagas", NS, "b")["status"]["phase"] == "Compensated"
    await asyncio.wait_for(waiting, timeout=5)
    assert operator.kube.body("sagas", NS, "a")["status"]["phase"] == "Compensated"
    assert operator.context.slots.free == 1  # every slot given back


async def test_sagas_waiting_for_a_slot_wait_in_a_queue_not_as_tasks(operator: Operator) -> None:
    """Memory when an operator takes charge of thousands of sagas: with 2 slots and 20 sagas to
    compensate, never more than 2 driver tasks exist, and the sagas of the 18 drivers queued
    behind them are held as JSON; all 20 are compensated, and every slot is free at the end,
    including those of drivers stopped before they ran."""
    slots = SagaSlots(2)
    engine = operator.engine(slots=slots)
    names = [f"s{i:02d}" for i in range(20)]
    for name in names:
        saga = operator.saga(name, outcome="Abort")
        operator.entry(saga, 1, indexed=False)
        engine.informer.saga_event("MODIFIED", saga)
    assert [d.copy.as_json for d in engine.drivers.running.values()] == [False] * 2 + [True] * 18
    most = 0

    async def finished() -> int:
        nonlocal most
        most = max(most, sum(1 for d in engine.drivers.running.values() if d.task is not None))
        return sum(operator.kube.body("sagas", NS, n).get("status", {}).get("phase") == "Compensated" for n in names)

    await eventually(finished, lambda done: done == len(names), 10, "20 sagas Compensated")
    # The last driver writes Compensated before it gives its slot back.
    await eventually(lambda: _return(slots.free), lambda free: free == 2, 2, "both slots free")
    assert most <= 2
    async with Slot(slots, NS):  # one slot held elsewhere: t1 is given the other, t2 and t3 wait
        for name in ("t1", "t2", "t3"):
            engine.informer.saga_event("MODIFIED", operator.saga(name, outcome="Abort"))
        await asyncio.sleep(0)  # the dispatcher started t1's task, which has not run yet
        assert [key[1] for key, d in engine.drivers.running.items() if d.task is not None] == ["t1"]
        await engine.stop()
    assert slots.free == 2
    assert engine.drivers.running == {}
    assert not engine.drivers.queued


async def test_a_namespace_whose_sagas_queue_behind_another_namespaces_hundreds_is_served_next(
    operator: Operator,
) -> None:
    """One tenant's 30 sagas aborted together against a slow participant fill the operator's
    slots; another tenant's saga, aborted after them, gets the next slot that frees up. In one
    queue it was compensated after all 30 (last of 31 calls)."""
    slots = SagaSlots(2)
    engine = operator.engine(slots=slots)
    calls: list[str] = []

    async def slow_for_busy(call: PreparedCall) -> None:
        calls.append(call.headers["Undolog-Saga"].split("/")[0])
        if calls[-1] == "busy":
            await asyncio.sleep(0.02)

    operator.transport.on_send = slow_for_busy
    for namespace in ("busy", "quiet"):
        operator.kube.put(
            "webhooks",
            {**operator.kube.body("webhooks", NS, "undo"), "metadata": {"name": "undo", "namespace": namespace}},
        )
    sagas = [("busy", f"b{i:02d}") for i in range(30)] + [("quiet", "q")]
    for namespace, name in sagas:
        saga = operator.saga(name, outcome="Abort", namespace=namespace)
        operator.kube.put("undoentries", entry_body(name, 1, namespace=namespace, owner_uid=saga["metadata"]["uid"]))
        engine.informer.saga_event("MODIFIED", saga)

    async def compensated() -> int:
        return sum(
            operator.kube.body("sagas", ns, n).get("status", {}).get("phase") == "Compensated" for ns, n in sagas
        )

    await eventually(compensated, lambda done: done == len(sagas), 10, "31 sagas Compensated")
    await engine.stop()
    assert len(calls) == 31
    assert calls.index("quiet") <= 3, calls


async def test_no_progress_write_while_every_slot_is_taken(operator: Operator, monkeypatch: pytest.MonkeyPatch) -> None:
    """A slow saga shows its progress (compensatedCount) while it runs, but not while every slot
    is taken: then the operator is at its limit (thousands of sagas resuming), and a progress
    write per saga only slowed them all."""
    monkeypatch.setattr("undolog.controller.saga_status.COUNTER_INTERVAL", 0.0)  # progress after every entry
    writes: list[Body] = []
    plain = operator.kube.patch_status

    async def recorded(plural: Plural, namespace: str, name: str, patch: Body) -> Body:
        if plural == "sagas":
            writes.append(patch["status"])
        return await plain(plural, namespace, name, patch)

    operator.kube.patch_status = recorded  # type: ignore[method-assign]
    for name, crowded in (("free", False), ("crowded", True)):
        saga = operator.saga(name, outcome="Abort")
        for position in (1, 2, 3):
            operator.entry(saga, position)
        operator.context.slots = SagaSlots(1 if crowded else 2)
        writes.clear()
        await operator.run_until(name, "Compensated", within=5)
        progress = [] if crowded else ["Compensating", "Compensating"]  # after entries 3 and 2
        assert [w.get("phase") for w in writes] == ["Compensating", *progress, "Compensated"]


async def test_a_call_waits_for_its_token_in_its_slot_or_a_saga_waiting_for_its_place_blocks_it_forever() -> None:
    """A call holding a place in flight that gave its slot up to wait for a token needed the slot
    back to go, while the saga holding it waited for that place: bench.wave's 500 sagas stopped
    after three compensations."""
    slots, pacing = SagaSlots(1), Pacing(without_slot)
    paced = Target(
        url="http://127.0.0.1:1/refund",
        timeout_seconds=5,
        participant="ns/refund",
        limits=Limits.model_validate({"calls_per_second": 10, "burst": 1, "in_flight": 1}),
        outage_budget_seconds=30,
    )
    called: list[str] = []

    async def saga(name: str) -> None:
        async with Slot(slots, name), pacing.turn(paced, None):
            called.append(name)

    await saga("first")  # the burst's token
    waiting_for_a_token = asyncio.create_task(saga("a"))
    await asyncio.sleep(0.02)  # a holds the place in flight and waits about 0.1 s for a token
    waiting_for_a_place = asyncio.create_task(saga("b"))
    await asyncio.wait_for(asyncio.gather(waiting_for_a_token, waiting_for_a_place), 2)
    assert called == ["first", "a", "b"]
