"""Which saga an agent request belongs to, found once per request: its session's
(sessions.py), or, on the stateless revision, the one its saga handle names (handles.py).
Everything else about a step, the agent's own tools and their counts is the same in both."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from typing import Any

from undolog.gateway.upstreams import Answer, Rounds
from undolog.sdk import SagaRun

# A step at a position of a saga: (run, position, what the agent's answer carries besides, carried).
StepAt = Callable[[SagaRun, int, dict[str, Any], bool], Awaitable[Answer]]


class SagaBinding(ABC):
    rounds: Rounds | None = None  # a stateless agent's answers to a server's questions, passed on
    confirmed: bool = False  # the user allowed the call (a question of its server's carries that on)
    carry_on: str = "carry on"  # what an agent is told after a rewind

    @abstractmethod
    async def named(self, tool: str) -> SagaRun | None:
        """The saga the request names, for the agent's own `tool`; None when none is open."""

    @abstractmethod
    async def opened(self) -> SagaRun:
        """The request's saga, opened when it names none."""

    @abstractmethod
    async def step(self, tool: str, call: StepAt) -> Answer:
        """`call` as the saga's next step (an open round's own, for a retry), and what the agent
        gets back; NotCalled naming `tool` when the saga cannot be had."""

    @abstractmethod
    def meta(self, run: SagaRun) -> dict[str, Any]:
        """What each answer in this saga carries in `_meta` besides the saga and the step."""

    @abstractmethod
    def ended(self, run: SagaRun) -> None:
        """`run` was committed or aborted (a session's next mapped call opens another)."""
