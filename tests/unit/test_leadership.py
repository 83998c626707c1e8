"""The Lease election on its seams (a fake Lease store, a fake clock): one holder at a time, a
standby waits out the holder's Lease on its own clock, every new holder (or new process of the
same pod) gets a higher fence, and a holder whose renewal is older than the deadline may not
send, whatever answer arrives late."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import os
import subprocess
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from undolog import errors
from undolog.controller.leadership import Leadership, LeaseSettings
from undolog.controller.main import ends_the_process
from undolog.controller.replicas import Replicas
from undolog.decisions.sharding import Shard, all_shards
from undolog.kube import Body

SETTINGS = LeaseSettings("ns", lease_seconds=6)  # renew deadline 4 s


@dataclass
class FakeLeases:
    stored: dict[str, Body] = field(default_factory=dict)
    version: int = 0
    reads: int = 0

    async def get_lease(self, namespace: str, name: str) -> Body:
        self.reads += 1
        if name not in self.stored:
            raise errors.NotFound("no lease", status=404)
        return copy.deepcopy(self.stored[name])

    async def create_lease(self, namespace: str, body: Body) -> Body:
        name = body["metadata"]["name"]
        if name in self.stored:
            raise errors.AlreadyExists("exists", status=409, reason="AlreadyExists")
        return self._store(name, body)

    async def replace_lease(self, namespace: str, name: str, body: Body) -> Body:
        if name not in self.stored:
            raise errors.NotFound("no lease", status=404)
        version = body["metadata"].get("resourceVersion")  # none: unconditional, as the API does
        if version is not None and version != self.stored[name]["metadata"]["resourceVersion"]:
            raise errors.Conflict("changed", status=409)
        return self._store(name, body)

    async def list_leases(self, namespace: str, label_selector: str) -> list[Body]:
        key, value = label_selector.split("=")
        return [copy.deepcopy(b) for b in self.stored.values() if b["metadata"].get("labels", {}).get(key) == value]

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
    fence = first.token()
    assert fence is not None
    assert not await second._acquire_or_renew()  # held, renewed just now
    clock.now += 5
    assert not await second._acquire_or_renew()  # 5 s of 6 since it first saw that record
    clock.now += 1.5
    assert await second._acquire_or_renew()  # not renewed for the Lease's duration: taken
    assert (second.token() or 0) > fence
    assert not await first._acquire_or_renew()  # the old holder sees it is someone else's
    assert leases.stored["undolog-operator"]["spec"]["holderIdentity"] == "b"


async def test_a_lease_deleted_by_hand_is_taken_with_a_higher_fence_than_any_before() -> None:
    """`kubectl delete lease` (a known cure for a stuck election) started the transition count
    again: the next holder's fence was 0, lower than that of the holder it replaced, so a
    participant keeping the highest fence refused every call of the new holder and took the
    late ones of the old."""
    leases, clock = FakeLeases(), Clock()
    assert await Leadership(leases, SETTINGS, "a", clock)._acquire_or_renew()
    holder = Leadership(leases, SETTINGS, "a", clock)  # a's process restarted: a new fence
    assert await holder._acquire_or_renew()
    replaced = holder.token()
    assert replaced is not None
    del leases.stored["undolog-operator"]
    standby = Leadership(leases, SETTINGS, "b", clock)
    assert await standby._acquire_or_renew()
    taken = standby.token()
    assert taken is not None
    assert taken > replaced
    clock.now += 1
    assert not await holder._acquire_or_renew()  # b's now
    assert await standby._acquire_or_renew()
    assert standby.token() == taken  # a renewal keeps the fence
    del leases.stored["undolog-operator"]
    assert await standby._acquire_or_renew()  # made again by its own holder: someone may have held it between
    again = standby.token()
    assert again is not None
    assert again > taken


async def test_a_renewal_keeps_the_standby_out() -> None:
    leases, clock = FakeLeases(), Clock()
    holder, standby = Leadership(leases, SETTINGS, "a", clock), Leadership(leases, SETTINGS, "b", clock)
    assert await holder._acquire_or_renew()
    fence = holder.token()
    for _ in range(5):
        clock.now += 3
        assert await holder._acquire_or_renew()
        assert not await standby._acquire_or_renew()
    assert holder.token() == fence  # renewals keep it


async def test_a_holder_renews_with_one_write_and_reads_the_lease_only_once_another_wrote_it() -> None:
    leases, clock = FakeLeases(), Clock()
    holder, standby = Leadership(leases, SETTINGS, "a", clock), Leadership(leases, SETTINGS, "b", clock)
    assert await holder._acquire_or_renew()
    holder.leading, fence, reads = True, holder.token(), leases.reads  # as `run` marks it
    for _ in range(3):
        clock.now += 2
        assert await holder._acquire_or_renew()
    assert leases.reads == reads  # renewed without reading: one request a period
    lease = leases.stored["undolog-operator"]
    lease["metadata"].setdefault("labels", {})["edited"] = "by-hand"
    leases._store("undolog-operator", lease)  # a person's edit: the holder's record is stale
    assert await holder._acquire_or_renew()
    assert leases.reads == reads + 1
    assert holder.token() == fence
    assert leases.stored["undolog-operator"]["metadata"]["labels"] == {"edited": "by-hand"}  # kept
    assert not await standby._acquire_or_renew()  # held: the standby starts counting on its own clock
    clock.now += 7  # the holder stopped renewing: the standby takes the Lease
    assert await standby._acquire_or_renew()
    assert not await holder._acquire_or_renew()  # its stale write refused, the Lease read: not held
    assert holder._another_holds()


async def test_a_restarted_process_of_the_same_pod_takes_its_lease_back_at_once_with_a_new_fence() -> None:
    leases, clock = FakeLeases(), Clock()
    before = Leadership(leases, SETTINGS, "pod-0", clock)
    assert await before._acquire_or_renew()
    restarted = Leadership(leases, SETTINGS, "pod-0", clock)  # kill -9, the container restarts
    assert await restarted._acquire_or_renew()
    assert (restarted.token() or 0) > (before.token() or 0)  # participants can tell the old process from the new one


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
    assert (standby.token() or 0) > (holder.token() or 0)


@dataclass
class LateRenewalLeases(FakeLeases):
    """A renewal cancelled by the stop still reaches the API, after the release read the Lease."""

    late: int = 1

    async def replace_lease(self, namespace: str, name: str, body: Body) -> Body:
        if self.late and body["spec"].get("holderIdentity") == "":
            self.late -= 1
            self.stored[name]["spec"]["renewTime"] = "later"
            self._store(name, self.stored[name])
        return await super().replace_lease(namespace, name, body)


async def test_a_lease_renewed_as_the_holder_stops_is_still_handed_back() -> None:
    """Seen in CI: the stop cancelled a renewal the API carried out after the release read the
    Lease; the release's write conflicted and the Lease stayed with a process that was gone."""
    leases, clock = LateRenewalLeases(), Clock()
    holder = Leadership(leases, SETTINGS, "a", clock)
    assert await holder._acquire_or_renew()
    holder.leading = True
    await holder.release()
    assert leases.stored[SETTINGS.name]["spec"]["holderIdentity"] == ""


async def test_a_lease_taken_as_the_holder_stops_is_handed_back_though_it_never_led() -> None:
    """The write that took the Lease landed, its answer did not reach the loop before the stop."""
    leases, clock = FakeLeases(), Clock()
    holder = Leadership(leases, SETTINGS, "a", clock)
    assert await holder._acquire_or_renew()
    await holder.release()
    assert leases.stored[SETTINGS.name]["spec"]["holderIdentity"] == ""


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

    def _reach(self) -> None:
        if self.down:
            raise errors.KubeError("the request timed out", status=504)

    async def get_lease(self, namespace: str, name: str) -> Body:
        self._reach()
        return await super().get_lease(namespace, name)

    async def replace_lease(self, namespace: str, name: str, body: Body) -> Body:
        self._reach()
        return await super().replace_lease(namespace, name, body)


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


# -- shards: a replica stands only for its fair share, and hands back what is over it ----------


async def run_for(seconds: float, *elections: Any) -> None:
    tasks = [asyncio.create_task(e) for e in elections]
    try:
        await asyncio.sleep(seconds)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def noop() -> None:
    return None


async def test_a_replica_that_may_not_take_a_free_lease_leaves_it_free() -> None:
    leases = FakeLeases()
    replica = Leadership(leases, LeaseSettings("ns", lease_seconds=3), "a")
    await run_for(1.5, replica.run(noop, noop, may_take=lambda: False))
    assert not replica.leading
    assert leases.stored == {}


async def test_a_shard_handed_back_is_free_at_once_for_another_replica() -> None:
    leases = FakeLeases()
    settings = LeaseSettings("ns", lease_seconds=3)
    a, b = Leadership(leases, settings, "a"), Leadership(leases, settings, "b")
    assert await a._acquire_or_renew()
    a.leading = True
    followed: list[str] = []

    async def a_follows() -> None:
        followed.append("a")

    # b has just seen a renew: without the hand-back it would wait out the whole Lease (3 s)
    assert not await b._acquire_or_renew()
    await run_for(1.5, a.run(noop, a_follows, hand_back=lambda: True), b.run(noop, noop))
    assert followed == ["a"]  # a stopped driving before the Lease was given up
    assert (a.leading, b.leading) == (False, True)
    assert leases.stored["undolog-operator"]["spec"]["holderIdentity"] == "b"
    assert (b.token() or 0) > (a.token() or 0)


def test_each_shard_has_a_lease_of_its_own_and_one_shard_keeps_the_operators_lease() -> None:
    settings = LeaseSettings("ns", lease_seconds=6)
    assert settings.of_shard(Shard(0, 1)).name == "undolog-operator"
    assert [settings.of_shard(s).name for s in all_shards(3)] == [f"undolog-operator-shard-{i}" for i in range(3)]
    assert Leadership(FakeLeases(), settings.of_shard(Shard(2, 3)), "a").shard() == "2/3"


@dataclass
class Wall:
    now: datetime = datetime(2026, 12, 1, 4, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


def replica(leases: FakeLeases, me: str, shards: int, wall: Wall) -> Replicas:
    settings = LeaseSettings("ns", lease_seconds=6)
    shard_leases = [Leadership(leases, settings.of_shard(s), me) for s in all_shards(shards)]
    return Replicas(leases, settings, me, shard_leases, wall, clock=lambda: wall.now.timestamp())


async def test_replicas_count_the_live_ones_and_take_a_fair_share_of_the_shards() -> None:
    leases, wall = FakeLeases(), Wall()
    a, b, c = (replica(leases, name, 4, wall) for name in "abc")
    for member in (a, b, c, a, b):
        await member.refresh()
    assert (a.live, b.live, c.live) == (3, 3, 3)
    for index in range(2):
        a.shards[index].leading = True
    assert not a.may_take()
    assert a.hand_back(1)() is False
    wall.now += timedelta(seconds=7)  # b and c stop renewing (killed): a alone is left
    await a.refresh()
    assert a.live == 1
    assert a.may_take()
    await b.refresh()
    await a.refresh()
    assert a.live == 2
    for index in range(4):
        a.shards[index].leading = True
    assert [a.hand_back(i)() for i in range(4)] == [False, False, False, True]  # the highest first
    await b.leave()
    await a.refresh()
    assert a.live == 1
    assert a.hand_back(3)() is False


async def test_a_replica_whose_clock_runs_ahead_is_counted_out_once_it_stops_renewing() -> None:
    """Judged on wall clocks, b's renewTime (its clock an hour ahead) looked fresh to a for an
    hour after b died: a kept to half the shards, and b's were driven by no one."""
    leases, wall_a = FakeLeases(), Wall()
    wall_b = Wall(wall_a.now + timedelta(hours=1))
    a, b = replica(leases, "a", 4, wall_a), replica(leases, "b", 4, wall_b)
    for member in (a, b, a):
        await member.refresh()
    assert a.live == 2
    for wall in (wall_a, wall_b):
        wall.now += timedelta(seconds=2)
    await b.refresh()  # its last renewal
    await a.refresh()
    assert a.live == 2
    for wall in (wall_a, wall_b):
        wall.now += timedelta(seconds=7)  # b was killed: more than its Lease (6 s) without a renewal
    await a.refresh()
    assert a.live == 1
    assert a.may_take()


async def test_a_replica_with_another_number_of_shards_waits_for_the_older_ones_to_go() -> None:
    leases, wall = FakeLeases(), Wall()
    old = replica(leases, "old", 2, wall)
    await old.refresh()
    wall.now += timedelta(seconds=1)
    new = replica(leases, "new", 4, wall)
    await new.refresh()
    await old.refresh()
    assert (new.waiting_for, new.may_take()) == ("old", False)  # its buckets would overlap old's shards
    assert (old.waiting_for, old.may_take(), old.live) == (None, True, 1)
    await old.leave()  # the rolling upgrade stopped it
    await new.refresh()
    assert (new.waiting_for, new.may_take()) == (None, True)


async def test_a_replica_restarted_under_its_name_takes_its_membership_lease_over() -> None:
    leases, wall = FakeLeases(), Wall()
    await replica(leases, "pod-0", 4, wall).refresh()
    again = replica(leases, "pod-0", 4, wall)  # kill -9, the container restarts
    await again.refresh()
    assert again.live == 1
    assert len(leases.stored) == 1


async def test_a_membership_lease_deleted_by_hand_is_taken_again() -> None:
    """`kubectl delete leases --all` in the operator's namespace: each replica kept renewing the
    slot it had, which no longer existed, so every count failed from then on and no replica took
    a free shard again (those of a replica that died later were driven by no one)."""
    leases, wall = FakeLeases(), Wall()
    a, b = replica(leases, "a", 4, wall), replica(leases, "b", 4, wall)
    for member in (a, b, a):
        await member.refresh()
    leases.stored.clear()
    for member in (a, b, a):
        await member.refresh()
    assert (a.counted, a.live, b.counted, b.live) == (True, 2, True, 2)
    assert sorted(leases.stored) == [f"undolog-operator-replica-{k}" for k in range(2)]


async def test_replicas_that_come_and_go_reuse_the_slots_of_those_gone() -> None:
    """Pods get new names on every rollout: their membership Leases are slots taken over once
    emptied or expired, never one more Lease per pod that ever ran."""
    leases, wall = FakeLeases(), Wall()
    first = [replica(leases, f"rollout-1-{i}", 4, wall) for i in range(3)]
    for member in first:
        await member.refresh()
    await first[0].leave()  # a clean stop empties its slot; the others are killed and expire
    wall.now += timedelta(seconds=7)
    second = [replica(leases, f"rollout-2-{i}", 4, wall) for i in range(3)]
    for member in second + second:
        await member.refresh()
    assert sorted(leases.stored) == [f"undolog-operator-replica-{k}" for k in range(3)]
    assert [m.live for m in second] == [3, 3, 3]


async def test_a_task_meant_to_run_as_long_as_the_process_that_ends_stops_the_process(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An election that ended with an unforeseen error left its shard driven by no one, with the
    process up and healthy and nothing in its log until the task was collected. Now the process
    stops (as SIGTERM stops it) and is started again; a task cancelled on a clean stop does not."""
    stopped: list[str] = []

    async def broken() -> None:
        raise RuntimeError("a defect")

    ended = asyncio.create_task(broken(), name="Lease of shard 0/2")
    cancelled = asyncio.create_task(asyncio.Event().wait(), name="Lease of shard 1/2")
    for task in (ended, cancelled):
        stop = functools.partial(stopped.append, task.get_name())
        task.add_done_callback(functools.partial(ends_the_process, stop=stop))
    cancelled.cancel()
    await asyncio.gather(ended, cancelled, return_exceptions=True)
    await asyncio.sleep(0)  # done callbacks run on the loop's next turn
    assert stopped == ["Lease of shard 0/2"]
    assert "Lease of shard 0/2 ended (RuntimeError('a defect')): the operator stops" in caplog.text


async def test_a_replica_that_could_not_count_the_others_takes_no_shard_until_it_has() -> None:
    """Its first count failed (the API had a blip as it started): it took every free shard as
    though it were alone. With an older replica started with another number of shards (a
    rolling upgrade that changes it), both then drove the same sagas: their shards' Leases
    differ, so only this count keeps them apart."""
    leases, wall = FakeLeases(), Wall()
    old = replica(leases, "old", 1, wall)
    await old.refresh()
    wall.now += timedelta(seconds=1)
    new = replica(leases, "new", 4, wall)
    listing = leases.list_leases

    async def blip(namespace: str, label_selector: str) -> list[Body]:
        raise errors.Unavailable("connection refused")

    leases.list_leases = blip  # type: ignore[method-assign]
    await new.refresh()
    assert not new.may_take()
    leases.list_leases = listing  # type: ignore[method-assign]
    await new.refresh()
    assert (new.waiting_for, new.may_take()) == ("old", False)
    await old.leave()
    await new.refresh()
    assert new.may_take()


@pytest.mark.parametrize("name", ["l" * 64, "Undolog", "undolog_operator", "-undolog"])
def test_a_lease_name_that_cannot_label_the_replicas_leases_is_refused_at_start(name: str) -> None:
    """A 64-character name is a valid Lease name, not a label value: every count of the replicas
    failed ("must be no more than 63 bytes"), and a replica that never counts takes no shard."""
    started = subprocess.run(
        [sys.executable, "-m", "undolog.cli", "operator", f"--lease-name={name}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "COLUMNS": "500"},  # the error on one line
    )
    assert started.returncode == 2, started.stderr
    assert "at most 63 lower-case letters" in started.stderr
