"""The Lease election on its seams (a fake Lease store, a fake clock): one holder at a time, a
standby waits out the holder's Lease on its own clock, every new holder (or new process of the
same pod) gets a higher fence, and a holder whose renewal is older than the deadline may not
send, whatever answer arrives late."""

from __future__ import annotations

import asyncio
import contextlib
import copy
from dataclasses import dataclass, field
from typing import Any

import pytest

from undolog import errors
from undolog.controller.leadership import Leadership, LeaseSettings
from undolog.kube import Body

SETTINGS = LeaseSettings("ns", lease_seconds=6)  # renew deadline 4 s


@dataclass
class FakeLeases:
    stored: dict[str, Body] = field(default_factory=dict)
    version: int = 0

    async def get_lease(self, namespace: str, name: str) -> Body:
        if name not in self.stored:
            raise errors.NotFound("no lease", status=404)
        return copy.deepcopy(self.stored[name])

    async def create_lease(self, namespace: str, body: Body) -> Body:
        name = body["metadata"]["name"]
        if name in self.stored:
            raise errors.AlreadyExists("exists", status=409, reason="AlreadyExists")
        return self._store(name, body)

    async def replace_lease(self, namespace: str, name: str, body: Body) -> Body:
        if body["metadata"].get("resourceVersion") != self.stored[name]["metadata"]["resourceVersion"]:
            raise errors.Conflict("changed", status=409)
        return self._store(name, body)

    def _store(self, name: str, body: Body) -> Body:
        self.version += 1
        stored = copy.deepcopy(body)
        stored["metadata"]["resourceVersion"] = str(self.version)
        self.stored[name] = stored
        return copy.deepcopy(stored)


@dataclass
class Clock:
    now: float = 100.0

    def __call__(self) -> float:
        return self.now


async def test_one_holder_a_standby_waits_out_the_lease_then_holds_with_a_higher_fence() -> None:
    leases, clock = FakeLeases(), Clock()
    first = Leadership(leases, SETTINGS, "a", clock)
    second = Leadership(leases, SETTINGS, "b", clock)
    assert await first._acquire_or_renew()
    assert first.token() == 0
    assert not await second._acquire_or_renew()  # held, renewed just now
    clock.now += 5
    assert not await second._acquire_or_renew()  # 5 s of 6 since it first saw that record
    clock.now += 1.5
    assert await second._acquire_or_renew()  # not renewed for the Lease's duration: taken
    assert second.token() == 1
    assert not await first._acquire_or_renew()  # the old holder sees it is someone else's
    assert leases.stored["undolog-operator"]["spec"]["holderIdentity"] == "b"


async def test_a_renewal_keeps_the_standby_out() -> None:
    leases, clock = FakeLeases(), Clock()
    holder, standby = Leadership(leases, SETTINGS, "a", clock), Leadership(leases, SETTINGS, "b", clock)
    assert await holder._acquire_or_renew()
    for _ in range(5):
        clock.now += 3
        assert await holder._acquire_or_renew()
        assert not await standby._acquire_or_renew()
    assert holder.token() == 0


async def test_a_restarted_process_of_the_same_pod_takes_its_lease_back_at_once_with_a_new_fence() -> None:
    leases, clock = FakeLeases(), Clock()
    assert await Leadership(leases, SETTINGS, "pod-0", clock)._acquire_or_renew()
    restarted = Leadership(leases, SETTINGS, "pod-0", clock)  # kill -9, the container restarts
    assert await restarted._acquire_or_renew()
    assert restarted.token() == 1  # participants can tell the old process from the new one


async def test_a_holder_whose_renewal_is_older_than_the_deadline_may_not_send() -> None:
    leases, clock = FakeLeases(), Clock()
    holder = Leadership(leases, SETTINGS, "a", clock)
    with pytest.raises(errors.NotLeading):
        holder.check()  # not leading yet
    assert await holder._acquire_or_renew()
    holder.leading, holder._renewed_at = True, clock.now
    holder.check()
    clock.now += 3.9
    holder.check()
    clock.now += 0.2  # frozen past the renew deadline (4 s): a standby may be about to take over
    with pytest.raises(errors.NotLeading):
        holder.check()


async def test_a_released_lease_is_taken_at_once() -> None:
    leases, clock = FakeLeases(), Clock()
    holder, standby = Leadership(leases, SETTINGS, "a", clock), Leadership(leases, SETTINGS, "b", clock)
    assert await holder._acquire_or_renew()
    assert not await standby._acquire_or_renew()
    holder.leading = True
    await holder.release()
    assert await standby._acquire_or_renew()  # no need to wait out the Lease
    assert standby.token() == 1


async def test_the_lease_is_renewed_while_the_new_holder_takes_charge() -> None:
    """Taking charge of many sagas can take longer than the Lease; the renewals go on meanwhile,
    so the holder may still send when it is ready (at 10,000 sagas it lost the Lease at once)."""
    leases = FakeLeases()
    settings = LeaseSettings("ns", lease_seconds=3)  # renew deadline 2 s, retry every 1 s
    holder = Leadership(leases, settings, "a")
    ready = asyncio.Event()
    could_send: list[bool] = []
    followed: list[bool] = []

    async def lead() -> None:
        await asyncio.sleep(3.2)  # longer than the renew deadline
        try:
            holder.check()
            could_send.append(True)
        except errors.NotLeading:
            could_send.append(False)
        ready.set()

    async def follow() -> None:
        followed.append(True)

    election = asyncio.create_task(holder.run(lead, follow))
    try:
        await asyncio.wait_for(ready.wait(), 10)
    finally:
        election.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await election
    assert could_send == [True]
    assert followed == []
    assert leases.version >= 3  # created, then renewed while lead() ran


async def test_a_holder_that_could_not_take_charge_tries_again() -> None:
    leases = FakeLeases()
    holder = Leadership(leases, LeaseSettings("ns", lease_seconds=3), "a")
    attempts: list[int] = []
    followed: list[bool] = []
    again = asyncio.Event()

    async def lead() -> None:
        attempts.append(1)
        if len(attempts) == 1:
            raise errors.KubeError("listing the entries timed out", status=504)
        again.set()

    async def follow() -> None:
        followed.append(True)

    election = asyncio.create_task(holder.run(lead, follow))
    try:
        await asyncio.wait_for(again.wait(), 10)
    finally:
        election.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await election
    assert len(attempts) == 2
    assert followed == [True]  # what the failed attempt left is cleaned up first


@dataclass
class FlakyLeases(FakeLeases):
    """A Lease store that cannot be reached while `down` (an apiserver too busy to answer)."""

    down: bool = False

    async def get_lease(self, namespace: str, name: str) -> Body:
        if self.down:
            raise errors.KubeError("the request timed out", status=504)
        return await super().get_lease(namespace, name)


async def elect(holder: Leadership, leases: FlakyLeases, *, starve: float, then: Any = None) -> list[str]:
    """Run the election; once leading, the store is unreachable for `starve` seconds (longer than
    the renew deadline), then `then(leases)` runs; returns what happened, in order."""
    seen: list[str] = []
    started = asyncio.Event()

    async def lead() -> None:
        seen.append("lead")
        started.set()

    async def follow() -> None:
        seen.append("follow")

    election = asyncio.create_task(holder.run(lead, follow))
    try:
        await asyncio.wait_for(started.wait(), 5)
        leases.down = True
        await asyncio.sleep(starve)
        with contextlib.suppress(errors.NotLeading):
            holder.check()
            seen.append("could send while starved")
        if then is not None:
            then(leases)
        leases.down = False
        await asyncio.sleep(2.5)  # two more rounds of the election
        try:
            holder.check()
            seen.append("sends")
        except errors.NotLeading:
            seen.append("fenced")
    finally:
        election.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await election
    return seen


async def test_a_holder_that_renews_late_is_fenced_meanwhile_and_carries_on_without_starting_over() -> None:
    leases = FlakyLeases()
    holder = Leadership(leases, LeaseSettings("ns", lease_seconds=3), "a")  # deadline 2 s
    assert await elect(holder, leases, starve=2.6) == ["lead", "sends"]


async def test_a_holder_that_finds_another_holder_after_a_late_renewal_stops_driving() -> None:
    def taken_by_b(leases: FlakyLeases) -> None:
        lease = leases.stored["undolog-operator"]
        lease["spec"].update(holderIdentity="b", leaseTransitions=1)
        leases._store("undolog-operator", lease)

    leases = FlakyLeases()
    holder = Leadership(leases, LeaseSettings("ns", lease_seconds=3), "a")
    assert await elect(holder, leases, starve=2.6, then=taken_by_b) == ["lead", "follow", "fenced"]
