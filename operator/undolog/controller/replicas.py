"""The replicas that share the shards: each holds a membership Lease of its own (a slot,
`<lease-name>-replica-<k>`: renewed every retry period, emptied on a clean stop, taken by the
next replica once it is empty or expired, so there are never more than the most replicas that
ever ran at once) and, from the live ones, knows its fair share.

The shards' Leases decide who drives what (safety); this only spreads them (balance): a
replica stands for a free shard while it holds less than its share and hands one back while it
holds more (a replica joined). A replica started with another number of shards (a rolling
upgrade that changes it) would cut the buckets differently, and stand for Leases of other
names: so a replica takes no shard while an older one with another number is alive (the new
ones wait for the old ones to go), nor before it has counted the others once. That case alone
rests on membership, and which replica is older by acquireTime, written on the API server's
clock (conventions.ClusterClock), which every replica follows once its own is 2 s off.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

from undolog import errors
from undolog.controller.leadership import Leadership, LeaseSettings
from undolog.conventions import REPLICA_OF_LABEL, SHARDS_ANNOTATION, now, timestamp
from undolog.decisions import sharding
from undolog.kube import Body

log = logging.getLogger("undolog.replicas")


class MemberStore(Protocol):
    """What membership needs of the API (undolog.kube.Kube; a fake in unit tests)."""

    async def create_lease(self, namespace: str, body: Body) -> Body: ...
    async def replace_lease(self, namespace: str, name: str, body: Body) -> Body: ...
    async def list_leases(self, namespace: str, label_selector: str) -> list[Body]: ...


@dataclass
class Replicas:
    kube: MemberStore
    settings: LeaseSettings  # the operator's Lease name, namespace and duration
    me: str
    shards: list[Leadership]
    wall: Callable[[], datetime] = now
    # Liveness is judged on this replica's own clock, as a shard's Lease is: a slot is alive
    # while its record keeps changing. Judged on wall clocks (renewTime against now), a replica
    # whose clock ran an hour ahead stayed "alive" an hour after it died, and the others held
    # back from its shards for that hour, so its sagas were driven by no one.
    clock: Callable[[], float] = time.monotonic
    live: int = 1  # replicas alive with the same number of shards, this one included
    waiting_for: str | None = None  # an older replica with another number of shards
    counted: bool = False  # the last count succeeded: until one has, no shard is taken
    _lease: Body | None = field(default=None, repr=False)
    _seen: dict[str, tuple[tuple[str, str], float]] = field(default_factory=dict, repr=False)  # slot: record, since

    async def run(self) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(self.settings.retry_period)

    async def refresh(self) -> None:
        """Renew this replica's slot (or take one) and count the live replicas."""
        try:
            members = await self.kube.list_leases(self.settings.namespace, f"{REPLICA_OF_LABEL}={self.settings.name}")
            await self._renew(members)
        except errors.KubeError as error:
            # Not known to be alone: an older replica with another number of shards holds Leases
            # of other names, so nothing but this count keeps the two from driving the same sagas.
            log.warning("the replicas of %s could not be counted: %s", self.settings.name, error.message)
            self.counted = False
            return
        self.counted = True
        count, mine = len(self.shards), self._acquired(self._lease or {})
        alive = [m for m in members if self._alive(m) and _holder(m) != self.me]
        self.live = 1 + sum(1 for m in alive if _shards(m) == count)
        older = [m for m in alive if _shards(m) != count and self._acquired(m) < mine]
        self.waiting_for = _holder(older[0]) if older else None
        if self.waiting_for:
            log.warning(
                "%s waits: %s drives %s shards, this one was started with %s; it takes none until that one is gone",
                self.me,
                self.waiting_for,
                _shards(older[0]),
                count,
            )

    def held(self) -> list[int]:
        return [index for index, shard in enumerate(self.shards) if shard.leading]

    def may_take(self) -> bool:
        return (
            self.counted
            and self.waiting_for is None
            and sharding.may_take(len(self.held()), len(self.shards), self.live)
        )

    def hand_back(self, index: int) -> Callable[[], bool]:
        return lambda: sharding.to_hand_back(self.held(), len(self.shards), self.live) == index

    async def leave(self) -> None:
        """On a clean stop: the slot is emptied, so the others count one fewer at once."""
        if self._lease is None:
            return
        self._lease["spec"]["holderIdentity"] = ""
        try:
            await self.kube.replace_lease(self.settings.namespace, self._lease["metadata"]["name"], self._lease)
        except errors.KubeError as error:
            log.warning("the replica Lease %s was not emptied: %s", self._lease["metadata"]["name"], error.message)

    async def _renew(self, members: list[Body]) -> None:
        stamp = timestamp(self.wall())
        if self._lease is not None:
            self._lease["spec"]["renewTime"] = stamp
            try:
                self._lease = await self.kube.replace_lease(
                    self.settings.namespace, self._lease["metadata"]["name"], self._lease
                )
                return
            except (errors.Conflict, errors.NotFound):  # taken by another (found expired), or deleted by hand
                self._lease = None
        spec = {
            "holderIdentity": self.me,
            "leaseDurationSeconds": self.settings.lease_seconds,
            "acquireTime": stamp,
            "renewTime": stamp,
        }
        free = [m for m in members if _holder(m) in ("", self.me) or not self._alive(m)]
        free.sort(key=lambda m: _holder(m) != self.me)  # stable: this identity's own slot first
        if free:  # this identity's own slot (a restarted pod), else an empty or expired one
            slot = free[0]
            slot["spec"] = spec
            slot["metadata"].setdefault("annotations", {})[SHARDS_ANNOTATION] = str(len(self.shards))
            self._lease = await self.kube.replace_lease(self.settings.namespace, slot["metadata"]["name"], slot)
            return
        names = {m["metadata"]["name"] for m in members}
        name = next(f"{self.settings.name}-replica-{k}" for k in range(len(members) + 1) if
                    f"{self.settings.name}-replica-{k}" not in names)  # fmt: skip
        body: Body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": name,
                "namespace": self.settings.namespace,
                "labels": {REPLICA_OF_LABEL: self.settings.name},
                "annotations": {SHARDS_ANNOTATION: str(len(self.shards))},
            },
            "spec": spec,
        }
        self._lease = await self.kube.create_lease(self.settings.namespace, body)

    def _alive(self, member: Body) -> bool:
        """Renewed within its Lease's duration, as this replica's clock has seen it change. A
        record seen for the first time is judged by its renewTime (so a slot left by a replica
        killed long ago is free at once); from then on only by whether it changes."""
        spec = member.get("spec") or {}
        if not spec.get("holderIdentity"):
            return False  # emptied by a replica that stopped
        duration = spec.get("leaseDurationSeconds") or self.settings.lease_seconds
        name, record = member["metadata"]["name"], (str(spec["holderIdentity"]), str(spec.get("renewTime")))
        seen = self._seen.get(name)
        if seen is None or seen[0] != record:
            since = self.clock()
            if seen is None:
                renewed = _parsed(spec.get("renewTime"))
                if renewed is None or (self.wall() - renewed).total_seconds() > duration:
                    since = -math.inf
            seen = self._seen[name] = (record, since)
        return self.clock() - seen[1] <= duration

    @staticmethod
    def _acquired(member: Body) -> datetime:
        return _parsed((member.get("spec") or {}).get("acquireTime")) or datetime.max.replace(tzinfo=UTC)


def _holder(member: Body) -> str:
    return str((member.get("spec") or {}).get("holderIdentity") or "")


def _shards(member: Body) -> int:
    value = ((member.get("metadata") or {}).get("annotations") or {}).get(SHARDS_ANNOTATION, "1")
    return int(value) if value.isdigit() else 0


def _parsed(value: object) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None
