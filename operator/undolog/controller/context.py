"""What a saga's driver needs from the operator, in one small object (built with its shard's
parts; a driver tells its shard's informer what it wrote through `informer`, and nothing else)."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Protocol, TypeVar

from undolog.api import Saga, UndoEntry
from undolog.calls.runner import Fence
from undolog.controller.compensation import Compensator
from undolog.controller.entry_index import EntryIndex
from undolog.controller.forward import Forwarder
from undolog.controller.timeline import Timeline
from undolog.conventions import CLUSTER_CLOCK, Clock
from undolog.decisions.retention import RetentionPolicy
from undolog.decisions.turns import Turns
from undolog.kube.watch import Progress
from undolog.ledger import Ledger

T = TypeVar("T")


class ShardFeed(Protocol):
    """What a driver tells its shard's informer (controller/informer.py), and asks of it."""

    def written(self, saga: Saga) -> None:
        """The saga as just written in a new phase: every subscriber hears of it."""

    def finished(self, saga: Saga, entries: list[UndoEntry]) -> None:
        """The driver let its saga go, finished, holding these entries (the archive takes them)."""

    def seen_again(self, saga: Saga) -> None:
        """A copy its driver quit on as it arrived: handled anew."""

    def entries_seen(self, namespace: str) -> Progress | None:
        """How far the watch that shows every entry of a namespace has come; None where none does."""


@dataclass
class DriverContext:
    ledger: Ledger
    timeline: Timeline
    index: EntryIndex
    compensator: Compensator
    forwarder: Forwarder
    slots: SagaSlots  # sagas reconciled at once: memory and fairness with thousands of sagas
    informer: ShardFeed  # the shard's (controller/informer.py)
    fence: Fence  # checked before every move: a replaced leader neither writes nor calls
    retention: RetentionPolicy = field(default_factory=RetentionPolicy)  # stamps status.expiresAt when a saga finishes
    clock: Clock = CLUSTER_CLOCK  # wall and monotonic time: a test's own makes time pass


class SagaSlots:
    """The sagas reconciled at once (--max-concurrent-sagas), shared by the shards. A free slot
    goes to the namespaces in turn (decisions/turns.py), whoever asks: a driver to be started,
    one woken by a change or a timer, one back from a retry pause. Taken first come first
    served, the slots went to a busy namespace's drivers as they woke, one after another, and
    another namespace's saga waited behind all of them."""

    def __init__(self, total: int, away: int | None = None) -> None:
        self.free = total  # while some are free nobody waits
        self._waiting: Turns[asyncio.Future[None]] = Turns()
        # Sagas that may wait without a slot at once (a retry's backoff, an open breaker): as
        # many as the slots unless said. Each is a live driver holding its saga and entries
        # parsed, so memory stays bounded by twice the slots whatever the participants do; past
        # it a saga waits in its slot.
        self.away_free = total if away is None else away

    def step_away(self) -> bool:
        """Whether one more saga may wait without its slot (then it counts until `step_back`)."""
        if self.away_free <= 0:
            return False
        self.away_free -= 1
        return True

    def step_back(self) -> None:
        self.away_free += 1

    def locked(self) -> bool:
        return self.free == 0

    async def acquire(self, namespace: str) -> None:
        if self.free and not self._waiting:
            self.free -= 1
            return
        granted = asyncio.get_running_loop().create_future()
        self._waiting.append(namespace, granted)
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():  # given to it as it was cancelled
                self.release()
            granted.cancel()  # passed over when its turn comes
            raise

    def release(self) -> None:
        while self._waiting:
            granted = self._waiting.popleft()
            if not granted.done():
                granted.set_result(None)
                return
        self.free += 1


class Slot:
    """One of the operator's concurrent-saga slots (memory and fairness with thousands of
    sagas), held while a saga is reconciled and given up while it only waits for a retry
    (backoff, Retry-After): a saga waiting on a failing participant never keeps others waiting."""

    def __init__(self, slots: SagaSlots, namespace: str) -> None:
        self.slots = slots
        self.namespace = namespace
        self.held = False
        self.taking_back = asyncio.Lock()  # calls of one saga made together share the slot

    async def take(self) -> Slot:
        """Wait for a free slot and hold it (`async with` then keeps it, and gives it up)."""
        await self.slots.acquire(self.namespace)
        self.held = True
        return self

    def give_back(self) -> None:
        """A slot taken and never used (its driver stopped before it ran) is free again."""
        if self.held:
            self.held = False
            self.slots.release()

    async def __aenter__(self) -> Slot:
        if not self.held:
            await self.take()
        _current.set(self)
        return self

    async def __aexit__(self, *_: type[BaseException] | BaseException | TracebackType | None) -> None:
        _current.set(None)
        self.give_back()  # not held when cancelled while waiting to take it back

    async def away(self, waiting: Awaitable[T]) -> T:
        """Give the slot up while `waiting`, while fewer sagas than the bound wait so (else wait
        in it). With several calls of the saga under way, the first to wait gives it up and the
        first to wake takes it back: never two slots for one saga."""
        stepped = self.held and self.slots.step_away()
        if stepped:
            self.give_back()
        try:
            return await waiting
        finally:
            if stepped:
                self.slots.step_back()
            task = asyncio.current_task()
            if task is None or not task.cancelling():  # a driver stopped takes nothing back
                await self._take_back()

    async def _take_back(self) -> None:
        async with self.taking_back:
            if not self.held:
                await self.take()


_current: contextvars.ContextVar[Slot | None] = contextvars.ContextVar("undolog_slot", default=None)


async def without_slot(waiting: Awaitable[T]) -> T:
    """The runner's waits (between attempts, for an open breaker's probe): the saga's slot is
    free for others meanwhile."""
    slot = _current.get()
    return await (waiting if slot is None else slot.away(waiting))
