"""The parts of a shard that run only while this replica leads it (its drivers, retention, the
storage migration): registered once, started together when the shard's Lease is taken and
stopped together, newest first, when it is lost or the process stops."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


class LeaderRunnable(Protocol):
    def start(self) -> None:
        """Begin (its tasks created here); called once leading."""

    async def stop(self) -> None:
        """End its tasks and forget what it held (a new `start` begins afresh)."""


@dataclass
class LeaderRunnables:
    parts: list[LeaderRunnable] = field(default_factory=list)

    def register(self, runnable: LeaderRunnable) -> None:
        self.parts.append(runnable)

    def start(self) -> None:
        for part in self.parts:
            part.start()

    async def stop(self) -> None:
        for part in reversed(self.parts):
            await part.stop()
