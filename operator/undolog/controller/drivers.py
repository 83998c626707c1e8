"""The drivers of one shard's sagas that need work (a SagaConcern of its engine), and where the
entry watch's events go: each saga's driver is woken, or started when an entry gives its saga
work. A driver waits for a saga slot in the queue, and runs in it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from undolog.api import Saga, SagaPhase, UndoEntry
from undolog.calls.runner import Fence, fence_this_task
from undolog.controller.context import DriverContext, Slot
from undolog.controller.driver import SagaDriver
from undolog.controller.driver_queue import DriverQueue
from undolog.controller.entry_index import EntryIndex, SagaKey
from undolog.controller.entry_losses import report_orphans
from undolog.controller.entry_proof import Listed
from undolog.controller.entry_watch import EntryEvent
from undolog.controller.seen_sagas import SeenSagas
from undolog.decisions import compensation_plan, phases
from undolog.ledger import Unreadable


@dataclass
class ShardState:
    """What the engine of a shard holds and its drivers read: its sagas as last seen, its
    entries (the watch's index), and where it is in taking charge."""

    index: EntryIndex = field(default_factory=EntryIndex)
    sagas: SeenSagas = field(default_factory=SeenSagas)
    leading: bool = False  # True once the engine has indexed the entries (and holds the Lease)
    taking_charge: bool = False  # while the engine hands over what it listed
    listed_before_entries: dict[SagaKey, Listed] = field(default_factory=dict)  # while taking charge


class Drivers:
    def __init__(
        self, shard: ShardState, context: DriverContext, fence: Fence, seen_again: Callable[[Saga], None]
    ) -> None:
        self.shard, self.context, self.fence = shard, context, fence
        self.seen_again = seen_again  # a saga whose driver quit as it was seen again: handled anew
        self.running: dict[SagaKey, SagaDriver] = {}  # started, running or waiting for a slot
        self.queued = DriverQueue(context.slots, self._run, lambda driver: self.running.get(driver.key) is driver)

    # -- the saga watch ---------------------------------------------------------------------------

    def seen(self, saga: Saga, *, written: bool) -> None:
        if written:
            return  # its own driver wrote it
        key = saga.key
        driver = self.running.get(key)
        if driver is not None:
            driver.notify(saga)
        elif phases.needs_driver(saga):
            self.start(key).notify(saga)
        else:
            self.settled(key)

    def gone(self, key: SagaKey) -> None:
        driver = self.running.get(key)
        if driver is not None:
            driver.notify(None)

    def let_go(self, saga: Saga, entries: Sequence[UndoEntry]) -> None:
        return None

    # -- the entry watch --------------------------------------------------------------------------

    def entry_event(self, event: EntryEvent) -> None:
        if isinstance(event, Unreadable):
            self._unreadable(event)
            return
        entry, deleted = event
        if not self.shard.leading:
            return
        key: SagaKey = (entry.metadata.namespace, entry.spec.saga)
        if deleted:
            self._entry_deleted(key, entry)
            return
        driver = self.running.get(key)
        if driver is not None:
            driver.wake.set()
        elif self._gives_work(key, entry):
            self.start(key)
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
        if not self.shard.leading or key not in self.shard.sagas:
            return
        (self.running.get(key) or self.start(key)).lose(event.lost)

    def _entry_deleted(self, key: SagaKey, entry: UndoEntry) -> None:
        """An entry gone before it was compensated is reported on its saga, never skipped silently.
        (After a saga is deleted, the garbage collector removes its settled entries: no report.)"""
        seen = self.shard.sagas.get(key)
        if entry.status.state in compensation_plan.SETTLED or seen is None or seen.phase in (None, *phases.TERMINAL):
            return
        (self.running.get(key) or self.start(key)).vanish(entry)

    # -- running ------------------------------------------------------------------------------------

    def start(self, key: SagaKey) -> SagaDriver:
        """A driver for the saga, run once a slot is free (it waits in the queue until then;
        what wakes it meanwhile is kept for it)."""
        driver = SagaDriver(self.context, *key, resting=self.queued.behind())
        driver.listed = self.shard.listed_before_entries.get(key)
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
                    self.seen_again(came_back)
                else:
                    self.settled(key)

    def settled(self, key: SagaKey) -> None:
        """A Completed or Compensated saga needs its entries no more (memory, with thousands of
        sagas): an entry that changes later comes back with its event, and a driver proves the
        rest anew."""
        seen = self.shard.sagas.get(key)
        if (
            seen is not None
            and seen.phase in phases.TERMINAL
            and key not in self.running
            and not self.shard.taking_charge
        ):
            self.shard.index.forget(key)

    async def stop(self) -> None:
        tasks = [d.task for d in self.running.values() if d.task is not None] + self.queued.stop()
        for task in tasks:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*tasks, return_exceptions=True)
        self.running.clear()
