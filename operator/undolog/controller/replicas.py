"""The replicas that share the shards: each keeps a Lease of its own (its membership: renewed
every retry period, deleted on a clean stop) and, from the live ones, knows its fair share.

The shards' Leases decide who drives what (safety); this only spreads them (balance): a
replica stands for a free shard while it holds less than its share and hands one back while it
holds more (a replica joined). Membership is judged on wall clocks, which only skews the
balance, never the safety. A replica started with another number of shards (a rolling
upgrade that changes it) would cut the buckets differently, so a replica takes no shard while
an older one with another number is alive: the new ones wait for the old ones to go.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
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
    async def delete_lease(self, namespace: str, name: str) -> None: ...


@dataclass
class Replicas:
    kube: MemberStore
    settings: LeaseSettings  # the operator's Lease name, namespace and duration
    me: str
    shards: list[Leadership]
    wall: Callable[[], datetime] = now
    live: int = 1  # replicas alive with the same number of shards, this one included
    waiting_for: str | None = None  # an older replica with another number of shards
    _lease: Body | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return f"{self.settings.name}-replica-{hashlib.sha256(self.me.encode()).hexdigest()[:12]}"

    async def run(self) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(self.settings.retry_period)

    async def refresh(self) -> None:
        """Renew this replica's Lease and count the live ones."""
        try:
            await self._renew()
            members = await self.kube.list_leases(self.settings.namespace, f"{REPLICA_OF_LABEL}={self.settings.name}")
        except errors.KubeError as error:
            log.warning("the replicas of %s could not be counted: %s", self.settings.name, error.message)
            return
        count, mine = len(self.shards), self._acquired(self._lease or {})
        alive = [m for m in members if self._alive(m) and m["spec"].get("holderIdentity") != self.me]
        self.live = 1 + sum(1 for m in alive if _shards(m) == count)
        older = [m for m in alive if _shards(m) != count and self._acquired(m) < mine]
        self.waiting_for = older[0]["spec"].get("holderIdentity") if older else None
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
        return self.waiting_for is None and sharding.may_take(len(self.held()), len(self.shards), self.live)

    def hand_back(self, index: int) -> Callable[[], bool]:
        return lambda: sharding.to_hand_back(self.held(), len(self.shards), self.live) == index

    async def leave(self) -> None:
        """On a clean stop: the others count one fewer at once (and take its shards)."""
        try:
            await self.kube.delete_lease(self.settings.namespace, self.name)
        except errors.KubeError as error:
            log.warning("the Lease %s/%s was not deleted: %s", self.settings.namespace, self.name, error.message)

    async def _renew(self) -> None:
        stamp = timestamp(self.wall())
        if self._lease is None:
            body: Body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {
                    "name": self.name,
                    "namespace": self.settings.namespace,
                    "labels": {REPLICA_OF_LABEL: self.settings.name},
                    "annotations": {SHARDS_ANNOTATION: str(len(self.shards))},
                },
                "spec": {
                    "holderIdentity": self.me,
                    "leaseDurationSeconds": self.settings.lease_seconds,
                    "acquireTime": stamp,
                    "renewTime": stamp,
                },
            }
            try:
                self._lease = await self.kube.create_lease(self.settings.namespace, body)
                return
            except errors.AlreadyExists:  # this identity's previous process: take it over
                body["metadata"].pop("resourceVersion", None)
                self._lease = await self.kube.replace_lease(self.settings.namespace, self.name, body)
                return
        self._lease["spec"]["renewTime"] = stamp
        try:
            self._lease = await self.kube.replace_lease(self.settings.namespace, self.name, self._lease)
        except (errors.Conflict, errors.NotFound):
            self._lease = None  # deleted or changed by someone else: made again next time
            raise

    def _alive(self, member: Body) -> bool:
        spec = member.get("spec") or {}
        renewed = _parsed(spec.get("renewTime"))
        duration = spec.get("leaseDurationSeconds") or self.settings.lease_seconds
        return renewed is not None and (self.wall() - renewed).total_seconds() <= duration

    @staticmethod
    def _acquired(member: Body) -> datetime:
        return _parsed((member.get("spec") or {}).get("acquireTime")) or datetime.max.replace(tzinfo=UTC)


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
