"""Calls a participant through a transport until success, a permanent failure, or the retries
are used up.

The runner owns its retries (backoff with full jitter, Retry-After) instead of leaning on
kopf's handler retries, whose delays are measured in tens of seconds. Every attempt is
reported to `on_attempt` before the next one starts, so the caller can record it. Before each
attempt it asks the fence whether this operator still leads, and stamps its token on the call.
"""

from __future__ import annotations

import asyncio
import contextvars
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from undolog import errors
from undolog.api import Backoff
from undolog.calls.protocol import FENCE_HEADER, SHARD_HEADER
from undolog.calls.transport import PreparedCall, Target, Transport
from undolog.conventions import now
from undolog.decisions.retry import CallOutcome, Verdict, classify, next_delay


@dataclass(frozen=True)
class AttemptRecord:
    number: int
    started_at: datetime
    outcome: CallOutcome
    duration_milliseconds: int

    @property
    def verdict(self) -> Verdict:
        return classify(self.outcome)

    @property
    def error(self) -> str | None:
        """What went wrong, in one line; None for a success."""
        if self.verdict == Verdict.SUCCEEDED:
            return None
        return self.outcome.error or f"HTTP {self.outcome.status_code}"


@dataclass(frozen=True)
class CallResult:
    verdict: Verdict
    attempts: list[AttemptRecord]

    @property
    def last(self) -> AttemptRecord:
        return self.attempts[-1]


class Fence(Protocol):
    def check(self) -> None:
        """Raise errors.NotLeading unless this operator may still send."""
        ...

    def token(self) -> int | None:
        """The fencing token sent with every call (None: no Lease, nothing to send)."""
        ...

    def shard(self) -> str | None:
        """The shard the token belongs to (`<index>/<count>`), sent beside it."""
        ...


class Unfenced:
    """No Lease: a single process that always may send (the SDK's tests, tools)."""

    def check(self) -> None:
        return None

    def token(self) -> int | None:
        return None

    def shard(self) -> str | None:
        return None


class NoShard(Unfenced):
    """What a task outside any shard's driver may send: nothing."""

    def check(self) -> None:
        raise errors.NotLeading("this call belongs to no shard this operator drives")


_task_fence: contextvars.ContextVar[Fence | None] = contextvars.ContextVar("undolog_fence", default=None)


def fence_this_task(fence: Fence) -> None:
    """The fence of everything the current task (a saga's driver) does from now on: its shard's
    Lease. Tasks it starts inherit it."""
    _task_fence.set(fence)


class TaskFence:
    """The fence of the task at hand (one runner and one transport serve every shard)."""

    def check(self) -> None:
        self._fence().check()

    def token(self) -> int | None:
        return self._fence().token()

    def shard(self) -> str | None:
        return self._fence().shard()

    @staticmethod
    def _fence() -> Fence:
        return _task_fence.get() or NoShard()


OnAttempt = Callable[[AttemptRecord, float | None], Awaitable[None]]


class Runner:
    def __init__(
        self,
        transport: Transport,
        fence: Fence,
        *,
        rng: random.Random | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.transport = transport
        self.fence = fence
        self._rng = rng or random.Random()
        self._sleep = sleep  # between attempts (the operator frees the saga's slot meanwhile)

    async def close(self) -> None:
        await self.transport.close()

    async def call(
        self,
        target: Target,
        body: dict[str, Any],
        headers: Callable[[int], dict[str, str]],
        *,
        backoff: Backoff,
        max_retries: int | None,
        on_attempt: OnAttempt,
        first_attempt: int = 1,
        leaving: Callable[[], None] = lambda: None,
    ) -> CallResult:
        """Attempts until success, a permanent failure, or the retries are used up.

        `headers(n)` gives attempt n's headers (Undolog-Attempt changes, the keys do not).
        Attempt numbers continue from `first_attempt`, so a resumed call keeps counting.
        `leaving` is told each time an attempt leaves (see PreparedCall).
        """
        attempts: list[AttemptRecord] = []
        number = first_attempt
        while True:
            self.fence.check()
            sent = headers(number)
            token, shard = self.fence.token(), self.fence.shard()
            if token is not None:
                sent[FENCE_HEADER] = str(token)
            if shard is not None:
                sent[SHARD_HEADER] = shard
            started_at, began = now(), time.monotonic()
            outcome = await self.transport.send(PreparedCall(target, body, sent, leaving))
            record = AttemptRecord(number, started_at, outcome, int((time.monotonic() - began) * 1000))
            attempts.append(record)
            delay = next_delay(
                outcome, attempt=number, backoff=backoff, max_retries=max_retries, now=now(), rng=self._rng
            )
            await on_attempt(record, delay)
            if delay is None:
                return CallResult(record.verdict, attempts)
            await self._sleep(delay)
            number += 1
