"""Waiting and running beside: the few asyncio shapes the drivers, retention and the archive share."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import Any


async def woken(wake: asyncio.Event, seconds: float | None) -> None:
    """Until `wake` is set or `seconds` pass (None: no limit). Never `asyncio.wait_for`: on Python
    3.11 it returns normally when cancelled just as the event is set, and a driver that swallowed
    its cancellation kept looping, so stopping the engine never ended (seen at 10,000 sagas)."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await wake.wait()


async def beside(first: Awaitable[Any], *others: Awaitable[Any]) -> list[Any]:
    """Every outcome, exceptions as values: `first` run in this task, `others` as tasks beside
    it, waited for all the same when `first` raises, and cancelled with it. A task starts on the
    event loop's next turn, milliseconds later with sagas failing together: what must leave at
    once goes first."""
    tasks = [asyncio.ensure_future(other) for other in others]
    try:
        try:
            outcome = await first
        except Exception as error:
            outcome = error
        return [outcome, *await asyncio.gather(*tasks, return_exceptions=True)]
    finally:
        for task in tasks:
            task.cancel()  # nothing when they are over


def raise_first(outcomes: list[Any]) -> None:
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
