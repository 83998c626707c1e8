"""Retention of one shard's finished sagas (subscribed to its informer, run while leading): each is deleted at the
time its status.expiresAt says (decisions/retention.py), which is first stamped again when
its TTL or the operator's defaults make it another; with its entries (the garbage
collector's work), never before the archive holds it when an archive is configured, at a
bounded rate (--retention-rate: what it may take of the apiserver beside compensation work)."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import Counter
from datetime import datetime, timedelta
from typing import Protocol

from undolog import errors, metrics
from undolog.api import Saga
from undolog.calls.pace import Rate
from undolog.calls.runner import Fence
from undolog.controller.concurrency import woken
from undolog.controller.entry_index import SagaKey
from undolog.controller.shard_handler import ShardHandler
from undolog.conventions import CLUSTER_CLOCK, Clock
from undolog.decisions import retention
from undolog.decisions.retention import Due, Finished, Restamp, RetentionPolicy
from undolog.ledger import Ledger

log = logging.getLogger("undolog.retention")
ARCHIVE_RECHECK = timedelta(seconds=5)  # a due saga the archive does not hold yet is looked at again
FAILED_DELETE_PAUSE = timedelta(seconds=10)
# Deletions in flight at once (the pace bounds their rate): a busy apiserver takes a second or
# more to answer one, and 8 at once deleted 5.5 a second while 9 a second finished.
DELETES_AT_ONCE = 32


class ArchiveGate(Protocol):
    """What retention asks of the archive (controller/archiving.py)."""

    def holds(self, saga: Finished) -> bool:
        """Whether the archive has committed this saga at this resourceVersion (or later)."""
        ...

    def offer(self, saga: Finished) -> None:
        """Archive it (soon)."""
        ...


class Retention(ShardHandler):
    def __init__(
        self,
        ledger: Ledger,
        policy: RetentionPolicy,
        fence: Fence,
        pace: Rate,
        archive: ArchiveGate | None = None,
        clock: Clock = CLUSTER_CLOCK,
    ) -> None:
        self.ledger, self.policy, self.fence, self.pace = ledger, policy, fence, pace
        self.archive, self.clock = archive, clock
        self.kept: dict[SagaKey, Finished] = {}  # the finished sagas in etcd
        self.stamps: dict[SagaKey, Restamp] = {}  # their due times to stamp again first
        self.per_namespace: Counter[str] = Counter()
        self.deferred: dict[SagaKey, datetime] = {}
        self.deleting: set[SagaKey] = set()  # deletions in flight
        self.next_at: datetime | None = None  # when the loop wakes by itself
        self.wake = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    def saga_seen(self, saga: Saga, *, written: bool = False) -> None:
        """The saga as last seen: finished (kept track of, woken if it is due sooner, its due
        time stamped again if its status says another) or not."""
        record = retention.finished(saga)
        if record is None:
            self.saga_gone(saga.key)
            return
        stamp = retention.restamp(saga, self.policy)
        if stamp is not None:
            self.stamps[saga.key] = stamp
            self.wake.set()
        else:
            self.stamps.pop(saga.key, None)
        if saga.key not in self.kept:
            self.per_namespace[record.namespace] += 1
        self.kept[saga.key] = record
        kept = self.policy.kept_per_shard
        over_cap = kept is not None and self.per_namespace[record.namespace] > kept
        sooner = record.expires_at is not None and (self.next_at is None or record.expires_at < self.next_at)
        if over_cap or sooner:
            self.wake.set()

    def saga_gone(self, key: SagaKey) -> None:
        self.stamps.pop(key, None)
        record = self.kept.pop(key, None)
        if record is not None:
            self.per_namespace[record.namespace] -= 1
            if not self.per_namespace[record.namespace]:
                del self.per_namespace[record.namespace]
        self.deferred.pop(key, None)

    def archived(self, key: SagaKey) -> None:
        """The archive committed the saga: a deletion waiting for it may go now."""
        if self.deferred.pop(key, None) is not None:
            self.wake.set()

    def start(self) -> None:
        self.task = asyncio.create_task(self.run(), name="retention")

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
            self.task = None
        self.kept.clear()
        self.stamps.clear()
        self.per_namespace.clear()
        self.deferred.clear()
        self.deleting.clear()

    async def run(self) -> None:
        """Plans, and starts the deletion of what is due without waiting for the ones in flight:
        sagas fall due one by one, and a loop that waited for each batch deleted one at a time."""
        room = asyncio.Semaphore(DELETES_AT_ONCE)
        async with asyncio.TaskGroup() as deleting:
            while True:
                self.wake.clear()
                moment = self.clock.now()
                await self.restamp()
                candidates = [
                    f
                    for key, f in self.kept.items()
                    if key not in self.deleting and key not in self.stamps and self.deferred.get(key, moment) <= moment
                ]
                plan = retention.plan(candidates, self.policy, moment)
                for due in plan.due:
                    await room.acquire()
                    self.deleting.add(due.saga.key)
                    task = deleting.create_task(self.delete(due))
                    task.add_done_callback(functools.partial(self._done, room, due.saga.key))
                if plan.due:
                    continue
                wakes = [t for t in (plan.next_at, *self.deferred.values()) if t is not None]
                self.next_at = min(wakes, default=None)
                seconds = None if self.next_at is None else max((self.next_at - self.clock.now()).total_seconds(), 0.0)
                await woken(self.wake, seconds)

    async def restamp(self) -> None:
        """Each finished saga whose due time is not what its status says gets it stamped (paced
        with the deletions); its watch event then brings the copy that is judged."""
        while self.stamps:
            key, stamp = next(iter(self.stamps.items()))
            await self.pace.turn()
            if self.stamps.get(key) is not stamp:
                continue  # a newer copy came meanwhile, and with it its own stamp (or none)
            del self.stamps[key]
            try:
                self.fence.check()
                await self.ledger.stamp_expiry(
                    stamp.saga.namespace, stamp.saga.name, stamp.saga.resource_version, stamp.expires_at
                )
            except errors.NotLeading:
                return
            except errors.KubeError as error:  # changed (its event comes), gone, or the API away: seen again
                log.info("could not stamp the due time of saga %s/%s: %s", *key, error.message)

    def _done(self, room: asyncio.Semaphore, key: SagaKey, _: asyncio.Task[None]) -> None:
        self.deleting.discard(key)
        room.release()
        if key in self.deferred or key in self.kept:  # to be looked at again (a newer copy, a recheck)
            self.wake.set()

    async def delete(self, due: Due) -> None:
        record = self.kept.get(due.saga.key)
        if record != due.saga or record.key in self.stamps:  # changed or gone since it was planned
            return
        await self.pace.turn()
        if self.archive is not None and not self.archive.holds(record):
            self.archive.offer(record)
            self.deferred[record.key] = self.clock.now() + ARCHIVE_RECHECK
            return
        try:
            self.fence.check()
            await self.ledger.delete_finished(record.namespace, record.name, record.uid, record.resource_version)
        except errors.NotLeading:
            self.deferred[record.key] = self.clock.now() + ARCHIVE_RECHECK
            return
        except errors.NotFound:
            pass
        except errors.Conflict:  # it changed since (its watch event brings the new copy), or is another saga now
            log.info("saga %s/%s changed since it was due; not deleted", record.namespace, record.name)
            if self.kept.get(record.key) != record:
                return  # that event came while the delete was on its way: the newer copy is due in turn
        except errors.KubeError as error:
            log.warning("could not delete finished saga %s/%s: %s", record.namespace, record.name, error.message)
            self.deferred[record.key] = self.clock.now() + FAILED_DELETE_PAUSE
            return
        else:
            metrics.series.of(metrics.retention_deletions, record.namespace, record.phase).inc()
            log.info("deleted finished saga %s/%s (%s): %s", record.namespace, record.name, record.phase, due.why)
        self.saga_gone(record.key)
