"""The drivers of one shard's sagas that need work (subscribed to its informer, and run while
the shard is led): each saga's driver is started when a copy or an entry gives its saga work,
and woken by what changes after. A driver waits for a saga slot in the queue, and runs in it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping

from undolog.api import Saga, SagaPhase, UndoEntry
from undolog.calls.runner import Fence, fence_this_task
from undolog.controller.context import DriverContext, Slot
from undolog.controller.driver import SagaDriver
from undolog.controller.driver_queue import DriverQueue
from undolog.controller.entry_index import SagaKey
from undolog.controller.entry_losses import report_orphans
from undolog.controller.entry_proof import Listed
from undolog.controller.entry_watch import EntryEvent
from undolog.controller.informer import ShardState
from undolog.controller.shard_handler import ShardHandler
from undolog.decisions import compensation_plan, phases
from undolog.ledger import Unreadable


class Drivers(ShardHandler):
    def __init__(self, shard: ShardState, context: DriverContext, fence: Fence) -> None:
        self.shard, self.context, self.fence = shard, context, fence
        self.running: dict[SagaKey, SagaDriver] = {}  # started, running or waiting for a slot
        self.queued = DriverQueue(context.slots, self._run, lambda driver: self.running.get(driver.key) is driver)
        self.handing_over = False  # while the informer hands over what it listed
        self.listed_before_entries: Mapping[SagaKey, Listed] = {}  # while taking charge

    # -- the saga watch ---------------------------------------------------------------------------

    def saga_seen(self, saga: Saga, *, written: bool) -> None:
        if written:
            return  # its own driver wrote it
        key = saga.key
        driver = self.running.get(key)
        if driver is not None:
            driver.notify(saga)
        elif phases.needs_driver(saga):
            self.drive(key).notify(saga)
        else:
            self.settled(key)

    def saga_gone(self, key: SagaKey) -> None:
        driver = self.running.get(key)
        if driver is not None:
            driver.notify(None)

    def taking_charge(self, listed: Mapping[SagaKey, Listed]) -> None:
        self.handing_over, self.listed_before_entries = True, listed

    def took_charge(self) -> None:
        """The entries of a saga that has no driver yet may give it work (one registered late,
        or one whose saga does not exist); a saga being driven has them already. Then what
        needs no driver lets its entries go."""
        try:
            for key in self.shard.index.sagas():
                if key not in self.running:
                    for entry in self.shard.index.of(key).values():
                        self.entry_seen((entry, False))
        finally:
            self.handing_over, self.listed_before_entries = False, {}
        for key in list(self.shard.sagas):
            self.settled(key)

    # -- the entry watch --------------------------------------------------------------------------

    def entry_seen(self, event: EntryEvent) -> None:
        if isinstance(event, Unreadable):
            self._unreadable(event)
            return
        entry, deleted = event
        key: SagaKey = (entry.metadata.namespace, entry.spec.saga)
        if deleted:
            self._entry_deleted(key, entry)
            return
        driver = self.running.get(key)
        if driver is not None:
            driver.wake.set()
        elif self._gives_work(key, entry):
            self.drive(key)
        else:  # the echo of a write made for a saga since settled: not kept
            self.settled(key)

    def _gives_work(self, key: SagaKey, entry: UndoEntry) -> bool:
        seen = self.shard.sagas.get(key)
        if seen is None:  # no such saga known (yet): its driver finds out, and says so on the entry
            return phases.unclaimed(entry)
        if seen.phase == SagaPhase.COMPLETED:  # only an entry registered after the commit
            top = seen.top_position
            return top is not None and entry.spec.stack_position > top and phases.entry_needs_saga(entry)
        return phases.entry_needs_saga(entry)

    def _unreadable(self, event: Unreadable) -> None:
        key = (event.namespace, event.saga)
        if key not in self.shard.sagas:
            return
        (self.running.get(key) or self.drive(key)).lose(event.lost)

    def _entry_deleted(self, key: SagaKey, entry: UndoEntry) -> None:
        """An entry gone before it was compensated is reported on its saga, never skipped silently.
        (After a saga is deleted, the garbage collector removes its settled entries: no report.)"""
        seen = self.shard.sagas.get(key)
        if entry.status.state in compensation_plan.SETTLED or seen is None or seen.phase in (None, *phases.TERMINAL):
            return
        (self.running.get(key) or self.drive(key)).vanish(entry)

    # -- running ------------------------------------------------------------------------------------

    def drive(self, key: SagaKey) -> SagaDriver:
        """A driver for the saga, run once a slot is free (it waits in the queue until then;
        what wakes it meanwhile is kept for it)."""
        driver = SagaDriver(self.context, *key, resting=self.queued.behind())
        driver.listed = self.listed_before_entries.get(key)
        self.running[key] = driver
        self.queued.append(driver)
        return driver

    async def _run(self, driver: SagaDriver, slot: Slot) -> None:
        key, sagas = driver.key, self.shard.sagas
        fence_this_task(self.fence)  # the calls the driver makes carry its shard's Lease
        try:
            await driver.run(slot)
            if not driver.seen_saga and key not in sagas:
                await report_orphans(self.context, key)
        finally:
            if self.running.get(key) is driver:
                del self.running[key]
                if key in sagas:
                    sagas[key].saw(driver.copy.revision)  # a copy older than its last write is late
                came_back = driver.latest
                if driver.quit_gone and not driver.gone and came_back is not None:  # seen again as it quit
                    self.context.informer.seen_again(came_back)  # handled anew
                else:
                    self.settled(key)

    def settled(self, key: SagaKey) -> None:
        """A Completed or Compensated saga needs its entries no more (memory, with thousands of
        sagas): an entry that changes later comes back with its event, and a driver proves the
        rest anew."""
        seen = self.shard.sagas.get(key)
        if seen is not None and seen.phase in phases.TERMINAL and key not in self.running and not self.handing_over:
            self.shard.index.forget(key)

    def start(self) -> None:
        return None  # a driver starts when a saga needs one

    async def stop(self) -> None:
        tasks = [d.task for d in self.running.values() if d.task is not None] + self.queued.stop()
        for task in tasks:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*tasks, return_exceptions=True)
        self.running.clear()
