"""Drivers waiting for a saga slot, a namespace at a time in turn: each runs once a slot is
free. A driver waits here, not as a task of its own: 10,000 tasks waiting for a slot, with
their coroutines, were ~40 MiB when an operator took charge of as many sagas."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import Any

from undolog.controller.context import SagaSlots, Slot
from undolog.controller.driver import SagaDriver
from undolog.decisions.turns import Turns

Run = Callable[[SagaDriver, Slot], Coroutine[Any, Any, None]]


class DriverQueue:
    __slots__ = ("dispatcher", "queued", "run", "slots", "wanted")

    def __init__(self, slots: SagaSlots, run: Run, wanted: Callable[[SagaDriver], bool]) -> None:
        self.slots, self.run, self.wanted = slots, run, wanted  # wanted: not stopped while it waited
        self.queued: Turns[SagaDriver] = Turns()
        self.dispatcher: asyncio.Task[None] | None = None  # runs the queued drivers while there are any

    def __bool__(self) -> bool:
        return bool(self.queued)

    def behind(self) -> bool:
        """Whether a driver queued now waits behind others for a slot (more are queued than are free)."""
        return len(self.queued) >= self.slots.free

    def append(self, driver: SagaDriver) -> None:
        self.queued.append(driver.namespace, driver)
        if self.dispatcher is None:
            self.dispatcher = asyncio.create_task(self._dispatch(), name="saga drivers waiting for a slot")

    async def _dispatch(self) -> None:
        """Run the queued drivers, a namespace at a time in turn, each in the slot taken for it."""
        try:
            while self.queued:
                slot = await Slot(self.slots, self.queued.upcoming()).take()
                driver = self.queued.popleft()
                if not self.wanted(driver):
                    slot.give_back()
                    continue
                driver.task = asyncio.create_task(self.run(driver, slot), name=f"saga {driver.namespace}/{driver.name}")
                driver.task.add_done_callback(functools.partial(given_back, slot))  # stopped before it ran
        finally:
            self.dispatcher = None

    def stop(self) -> list[asyncio.Task[None]]:
        """Forget the queued drivers; the dispatcher's task, for the caller to cancel."""
        self.queued.clear()
        return [] if self.dispatcher is None else [self.dispatcher]


def given_back(slot: Slot, _: asyncio.Task[None]) -> None:
    slot.give_back()
