"""Each participant's turn for a call: its circuit breaker, its calls per second and its calls in
flight (a Webhook's spec.limits), held across every saga of this operator (the decisions are in
decisions.outage). A call waits for an open breaker through `away`, which gives its saga's slot
up meanwhile (a wait as long as an outage); for a place in flight and then a token in the slot
(as short as a few calls), and writes nothing while it waits.

With several replicas each holds its own breakers, and takes the share of a Webhook's limits
that the shards it holds are of all shards (`share`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from undolog.api import Limits
from undolog.calls.transport import Target
from undolog.decisions.outage import Breaker, Bucket, give_up_at, in_flight_share, share_of, unanswered
from undolog.decisions.retry import CallOutcome

T = TypeVar("T")


class Away(Protocol):
    def __call__(self, waiting: Awaitable[T], /) -> Awaitable[T]: ...


async def here(waiting: Awaitable[T]) -> T:
    """Wait with nothing to give up (the SDK's tools, tests)."""
    return await waiting


class OutageBudgetSpent(Exception):
    """The participant did not answer for longer than its Webhook's outage budget; what its
    last unanswered call met (another saga's, when this call waited on the breaker throughout)."""

    def __init__(self, last_error: str | None, certificate: str | None) -> None:
        super().__init__(last_error)
        self.last_error, self.certificate = last_error, certificate


OnChange = Callable[[str, Breaker, str | None], None]  # a breaker opened or closed; the last error


class Rate:
    """So many turns a second with a burst (decisions.outage.Bucket on a clock), each waited for:
    a participant's calls (spec.limits) and the operator's housekeeping writes (retention's
    deletions, the storage migration's rewrites) alike."""

    def __init__(self, per_second: float, burst: int = 1, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.bucket = Bucket.full(per_second, burst, clock())

    def resize(self, per_second: float, burst: int) -> None:
        if (self.bucket.rate, self.bucket.burst) != (per_second, burst):
            self.bucket = self.bucket.resized(per_second, burst)

    async def turn(self) -> None:
        self.bucket, wait = self.bucket.take(self.clock())
        while wait > 0:
            await asyncio.sleep(wait)
            self.bucket, wait = self.bucket.take(self.clock())


@dataclass
class ParticipantPace:
    breaker: Breaker = field(default_factory=Breaker)
    rate: Rate | None = None
    in_flight: int = 0
    users: int = 0
    last_error: str | None = None  # of the last unanswered call, said when a call's budget runs out
    certificate: str | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def idle(self, now: float) -> bool:
        """Nothing to remember: no failures counted, and a bucket (if any) full again."""
        full = self.rate is None or self.rate.bucket.tokens_at(now) >= self.rate.bucket.burst
        return self.breaker == Breaker() and full

    def notify(self) -> None:
        """Wake every call waiting on this participant; they look again."""
        self.changed.set()
        self.changed = asyncio.Event()


class Turn:
    """A call's turn: told the outcome, which moves the breaker."""

    def __init__(
        self, pacing: Pacing, participant: str, pace: ParticipantPace, probe: bool, last: bool, give_up_at: float
    ) -> None:
        self.pacing, self.participant, self.pace, self.probe = pacing, participant, pace, probe
        self.last = last  # the call's budget ran out while it waited: this probe is its last try
        self.give_up_at = give_up_at
        self.reported = False

    @property
    def budget_spent(self) -> bool:
        """Whether a call that was not answered this turn may not try again: its outage budget
        is spent (the one place the budget is judged: waiting on the breaker, and after)."""
        return self.last or self.pacing.clock() >= self.give_up_at

    def report(self, outcome: CallOutcome) -> None:
        self.reported = True
        pace, before, now = self.pace, self.pace.breaker, self.pacing.clock()
        if outcome.refusal is not None:  # never sent: says nothing of the participant
            pace.breaker = before.probe_back() if self.probe else before
        elif unanswered(outcome):
            pace.breaker = before.unanswered(now, probe=self.probe)
            pace.last_error, pace.certificate = outcome.error or f"HTTP {outcome.status_code}", outcome.certificate
        else:
            pace.breaker = before.answered()
        if pace.breaker.open != before.open:
            self.pacing.on_change(self.participant, pace.breaker, pace.last_error)
        if pace.breaker != before:
            pace.notify()


class Pacing:
    def __init__(
        self,
        away: Away = here,
        *,
        clock: Callable[[], float] = time.monotonic,
        share: Callable[[], tuple[int, int]] = lambda: (1, 1),
        on_change: OnChange = lambda participant, breaker, last_error: None,
    ) -> None:
        self.away, self.clock, self.share, self.on_change = away, clock, share, on_change
        self._paces: dict[str, ParticipantPace] = {}

    def breaker(self, participant: str) -> Breaker:
        pace = self._paces.get(participant)
        return pace.breaker if pace else Breaker()

    @contextlib.asynccontextmanager
    async def turn(self, target: Target, down_since: float | None, *, patient: bool = True) -> AsyncIterator[Turn]:
        """Wait for the participant's turn; OutageBudgetSpent when its breaker stays open past
        the budget, counted from `down_since` (this call's first unanswered attempt) or now.
        A call that is not `patient` (forward calls, effects) is not held by the breaker."""
        pace = self._paces.setdefault(target.participant, ParticipantPace())
        pace.users += 1
        turn: Turn | None = None
        try:
            giving_up = give_up_at(down_since, self.clock(), target.outage_budget_seconds)
            probe, last = await self._breaker_turn(pace, giving_up) if patient else (False, False)
            turn = Turn(self, target.participant, pace, probe, last, giving_up)
            await self._in_flight_turn(pace, target.limits)
            try:
                await self._rate_turn(pace, target.limits)  # last: the token is taken as the call leaves
                yield turn
            finally:
                pace.in_flight -= 1
                pace.notify()
        finally:
            if turn is not None and turn.probe and not turn.reported:  # cancelled: the next call probes
                pace.breaker = pace.breaker.probe_back()
                pace.notify()
            pace.users -= 1
            if pace.users == 0 and pace.idle(self.clock()):
                del self._paces[target.participant]

    async def _breaker_turn(self, pace: ParticipantPace, give_up_at: float) -> tuple[bool, bool]:
        """Whether this call goes out as the open breaker's probe, and as its last try: a call
        whose budget runs out before the next probe is due probes then (a retry a person asked
        for, with a budget shorter than the probes' backoff, would otherwise never be sent)."""
        while True:
            now = self.clock()
            wait = pace.breaker.wait(now)
            if wait == 0.0 or (now >= give_up_at and wait is not None):
                if not pace.breaker.open:
                    return False, False
                pace.breaker = pace.breaker.probe()
                return True, now >= give_up_at
            if now >= give_up_at:
                raise OutageBudgetSpent(pace.last_error, pace.certificate)
            await self._until_changed(pace, min(give_up_at - now, wait if wait is not None else give_up_at - now))

    async def _rate_turn(self, pace: ParticipantPace, limits: Limits | None) -> None:
        if limits is None or limits.calls_per_second is None:
            return
        held, shards = self.share()
        rate = share_of(limits.calls_per_second, held, shards)
        if pace.rate is None:
            pace.rate = Rate(rate, limits.burst, self.clock)
        pace.rate.resize(rate, limits.burst)
        # In the saga's slot: this call holds a place in flight, and a slot it had to take
        # back may be held by a saga waiting for that place (bench.wave stopped so).
        await pace.rate.turn()

    async def _in_flight_turn(self, pace: ParticipantPace, limits: Limits | None) -> None:
        """A place among the calls in flight, waited for in the saga's slot: as short as a call,
        and given back, each freed slot let one more saga in to wait too (bench.scale: 1,000
        sagas on one participant held 181.5 MiB instead of 112.0)."""
        limit = in_flight_share(limits, *self.share())
        while pace.in_flight >= limit:
            await self._until_changed(pace, None, away=False)
        pace.in_flight += 1

    async def _until_changed(self, pace: ParticipantPace, seconds: float | None, *, away: bool = True) -> None:
        changed = asyncio.wait_for(pace.changed.wait(), seconds)
        with contextlib.suppress(TimeoutError):
            await (self.away(changed) if away else changed)
