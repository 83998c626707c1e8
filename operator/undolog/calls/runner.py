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

from undolog import errors, tracing
from undolog.api import Backoff
from undolog.calls.pace import Away, OutageBudgetSpent, Pacing, here
from undolog.calls.protocol import FENCE_HEADER, SHARD_HEADER
from undolog.calls.transport import PreparedCall, Target, Transport
from undolog.conventions import now
from undolog.decisions.outage import unanswered
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
class CallTrace:
    """What an attempt's span is called and says, and the trace it joins (a W3C traceparent)."""

    name: str
    attributes: dict[str, str | int]
    parent: str | None = None


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
        away: Away = here,
        pacing: Pacing | None = None,
    ) -> None:
        self.transport = transport
        self.fence = fence
        self._rng = rng or random.Random()
        self._away = away  # waits between attempts and for a participant's turn free the saga's slot
        self.pacing = pacing or Pacing(away)

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
        patient: bool = False,
        trace: CallTrace | None = None,
    ) -> CallResult:
        """Attempts until success, a permanent failure, the retries are used up, or (`patient`:
        compensations) the participant did not answer for its outage budget (Verdict.UNAVAILABLE).

        `headers(n)` gives attempt n's headers (Undolog-Attempt changes, the keys do not).
        Attempt numbers continue from `first_attempt`, so a resumed call keeps counting, and its
        earlier attempts count as retries spent. For a patient call, an attempt the participant did
        not answer spends none (a forward call is better failed, and its saga compensated, than held
        for an hour). `leaving` is told each time an attempt leaves (see PreparedCall).
        """
        attempts: list[AttemptRecord] = []
        number, spent = first_attempt, first_attempt - 1
        down = Outage()
        while True:
            self.fence.check()
            try:
                sending = Sending(target, body, headers(number), leaving, patient, trace)
                record, budget_spent = await self._attempt(sending, number, down.since)
            except OutageBudgetSpent as spent_budget:  # waiting on the open breaker
                return await down.given_up(attempts, number, target, spent_budget, on_attempt)
            attempts.append(record)
            if patient and unanswered(record.outcome):
                down.saw(record, self.pacing.clock() - record.duration_milliseconds / 1000)
                if budget_spent:
                    await on_attempt(record, None)
                    return await down.given_up(attempts, number + 1, target, OutageBudgetSpent(None, None), on_attempt)
                # Backoff as usual, never counted: `max_retries=streak` lets every unanswered attempt retry.
                delay = next_delay(
                    record.outcome,
                    attempt=down.streak,
                    backoff=backoff,
                    max_retries=down.streak,
                    now=now(),
                    rng=self._rng,
                )
            else:
                down = Outage()
                spent += 1
                delay = next_delay(
                    record.outcome, attempt=spent, backoff=backoff, max_retries=max_retries, now=now(), rng=self._rng
                )
            await on_attempt(record, delay)
            if delay is None:
                return CallResult(record.verdict, attempts)
            await self._away(asyncio.sleep(delay))
            number += 1

    async def _attempt(self, call: Sending, number: int, down_since: float | None) -> tuple[AttemptRecord, bool]:
        """One attempt, once the participant's turn came (the fence asked again after waiting),
        in a span of its own whose context the participant is sent (`traceparent`); and whether
        the call's outage budget is spent (judged by the pacing)."""
        sent, trace = call.headers, call.trace
        async with self.pacing.turn(call.target, down_since, patient=call.patient) as turn:
            self.fence.check()
            token, shard = self.fence.token(), self.fence.shard()
            if token is not None:
                sent[FENCE_HEADER] = str(token)
            if shard is not None:
                sent[SHARD_HEADER] = shard
            attributes = {**(trace.attributes if trace else {}), "undolog.attempt": number}
            with tracing.span(
                trace.name if trace else "call", attributes, parent=trace.parent if trace else None
            ) as note:
                if (traceparent := tracing.traceparent()) is not None:
                    sent[tracing.TRACEPARENT_HEADER] = traceparent
                started_at, began = now(), time.monotonic()
                outcome = await self.transport.send(PreparedCall(call.target, call.body, sent, call.leaving))
                record = AttemptRecord(number, started_at, outcome, int((time.monotonic() - began) * 1000))
                note("undolog.outcome", record.error or "succeeded")
                if outcome.status_code is not None:
                    note("http.response.status_code", outcome.status_code)
            turn.report(outcome)
        return record, turn.budget_spent


@dataclass(frozen=True)
class Sending:
    """One attempt's call, as the runner sends it."""

    target: Target
    body: dict[str, Any]
    headers: dict[str, str]
    leaving: Callable[[], None]
    patient: bool
    trace: CallTrace | None


OUTAGE_TEXT = 1000  # the last attempt's error whole (an Attempt keeps 1024), behind what the wait was


@dataclass
class Outage:
    """A call's current run of unanswered attempts: when it began (on the pacing's clock)."""

    since: float | None = None
    streak: int = 0
    last_error: str | None = None
    certificate: str | None = None  # the last unanswered attempt's certificate rejection, if it was one

    def saw(self, record: AttemptRecord, at: float) -> None:
        self.since = self.since if self.since is not None else at
        self.streak += 1
        self.last_error, self.certificate = record.error, record.outcome.certificate

    async def given_up(
        self,
        attempts: list[AttemptRecord],
        number: int,
        target: Target,
        spent: OutageBudgetSpent,
        on_attempt: OnAttempt,
    ) -> CallResult:
        """The call's end when the outage budget ran out: a last record says so."""
        record = self.record(number, target, spent)
        attempts.append(record)
        await on_attempt(record, None)
        return CallResult(Verdict.UNAVAILABLE, attempts)

    def record(self, number: int, target: Target, spent: OutageBudgetSpent) -> AttemptRecord:
        """The attempt not made when the budget ran out, saying why (nothing was sent)."""
        budget = f"{target.outage_budget_seconds:g} s"
        last_error, certificate = (
            (self.last_error, self.certificate) if self.streak else (spent.last_error, spent.certificate)
        )
        last = f"; last: {last_error}" if last_error else ""
        error = f"participant {target.participant} did not answer for its outage budget ({budget}{last}); not sent"
        return AttemptRecord(number, now(), CallOutcome(error=error[:OUTAGE_TEXT], certificate=certificate), 0)
