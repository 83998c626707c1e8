"""Waiting on a condition with a timeout (never sleep-and-hope)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from undolog.kube import Body, Kube

T = TypeVar("T")


async def eventually(probe: Callable[[], Awaitable[T]], accept: Callable[[T], bool], within: float, what: str) -> T:
    deadline = time.monotonic() + within
    last: Any = None
    while time.monotonic() < deadline:
        last = await probe()
        if accept(last):
            return last
        await asyncio.sleep(0.05)
    raise AssertionError(f"{what} not reached in {within} s; last seen: {last}")


async def saga_phase(kube: Kube, namespace: str, name: str, phase: str, within: float = 30.0) -> Body:
    return await eventually(
        lambda: kube.get("sagas", namespace, name),
        lambda body: body.get("status", {}).get("phase") == phase,
        within,
        f"saga {name} phase {phase}",
    )
