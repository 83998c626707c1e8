"""A participant's outages and pace, decided over plain data: the circuit breaker and the token
bucket that `calls.pace` holds per participant (a Webhook), across every saga of the operator.

"The participant did not answer" (connection refused or reset, DNS failure, TLS handshake or
certificate failure, a timeout, 502, 503, 504) is an outage, not the participant's verdict on
the call: it spends no retries. After OPEN_AFTER such outcomes in a row, whichever sagas made
them, the breaker opens: calls wait, and one probe at a time goes out, FIRST_PROBE_SECONDS after
opening and then doubling up to MAX_PROBE_SECONDS. Any answer closes it (a probe's or a call's
that was already on its way). A call waits at most its Webhook's outage budget
(`give_up_at`), and goes at most `in_flight` at once to one participant.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from undolog.api import Limits
from undolog.decisions.retry import CallOutcome

DEFAULT_OUTAGE_BUDGET_SECONDS = 3600.0  # a Webhook's spec.outageBudgetSeconds when unset
DEFAULT_IN_FLIGHT = 32  # its spec.limits.inFlight when unset: also the HTTP transport's bound per participant
OPEN_AFTER = 5  # unanswered calls in a row, across sagas
FIRST_PROBE_SECONDS = 1.0
MAX_PROBE_SECONDS = 60.0
UNANSWERED_STATUSES = frozenset({502, 503, 504})
TOKEN_EPSILON = 1e-9  # a gateway or the service saying it is not there


def unanswered(outcome: CallOutcome) -> bool:
    """The participant did not answer the call (never true of a call refused before sending)."""
    if outcome.refusal is not None:
        return False
    return outcome.status_code is None or outcome.status_code in UNANSWERED_STATUSES


def outage_budget(seconds: int | None) -> float:
    """A Webhook's outage budget: its own, else the default."""
    return float(seconds) if seconds is not None else DEFAULT_OUTAGE_BUDGET_SECONDS


def give_up_at(down_since: float | None, now: float, budget: float) -> float:
    """When a call stops waiting for a participant that does not answer: its budget after its
    first unanswered attempt (`down_since`), or after now when it has none yet."""
    return (down_since if down_since is not None else now) + budget


def probe_delay(failed_probes: int) -> float:
    return min(FIRST_PROBE_SECONDS * 2.0**failed_probes, MAX_PROBE_SECONDS)


@dataclass(frozen=True)
class Breaker:
    """One participant's breaker. Times are the pace's monotonic clock, in seconds."""

    failures: int = 0  # unanswered outcomes in a row
    open_since: float | None = None
    failed_probes: int = 0
    probe_at: float = 0.0
    probing: bool = False  # a probe is out: no other call goes until it is back

    @property
    def open(self) -> bool:
        return self.open_since is not None

    def wait(self, now: float) -> float | None:
        """0 when a call may go now; else seconds until one might (None: until the probe is back)."""
        if not self.open:
            return 0.0
        if self.probing:
            return None
        return max(self.probe_at - now, 0.0)

    def probe(self) -> Breaker:
        """A waiting call goes out as the probe."""
        return replace(self, probing=True)

    def probe_back(self) -> Breaker:
        """The probe never went (refused before sending, or cancelled): the next call probes."""
        return replace(self, probing=False)

    def answered(self) -> Breaker:
        return Breaker()

    def unanswered(self, now: float, *, probe: bool) -> Breaker:
        if self.open:
            if not probe:
                return self  # a call sent before it opened: the probes set the pace
            failed = self.failed_probes + 1
            return replace(self, failed_probes=failed, probe_at=now + probe_delay(failed), probing=False)
        failures = self.failures + 1
        if failures < OPEN_AFTER:
            return replace(self, failures=failures)
        return Breaker(failures, open_since=now, probe_at=now + probe_delay(0))


@dataclass(frozen=True)
class Bucket:
    """Calls per second with a burst: a call leaves only with a token, taken at the moment it
    leaves (a reservation made earlier let calls whose event loop woke them late leave
    together: 61 in one second against 50 in bench.wave). In any window of T seconds at most
    `burst + rate * T` calls leave."""

    rate: float
    burst: float
    tokens: float
    at: float

    @classmethod
    def full(cls, rate: float, burst: int, now: float) -> Bucket:
        return cls(rate, float(burst), float(burst), now)

    def tokens_at(self, now: float) -> float:
        """The tokens there at `now`, refilled since the last take."""
        return min(self.burst, self.tokens + max(now - self.at, 0.0) * self.rate)

    def take(self, now: float) -> tuple[Bucket, float]:
        """The bucket after a try to take a token, and 0 when one was taken; else the seconds
        until one will be there (then try again: another call may take it first)."""
        tokens = self.tokens_at(now)
        if tokens >= 1.0 - TOKEN_EPSILON:  # refills that sum to 0.999... are a token, or waits shrink without end
            return replace(self, tokens=tokens - 1.0, at=now), 0.0
        return replace(self, tokens=tokens, at=now), (1.0 - tokens) / self.rate

    def resized(self, rate: float, burst: int) -> Bucket:
        """The same bucket under new limits (an edited Webhook, a replica's new share)."""
        return replace(self, rate=rate, burst=float(burst), tokens=min(self.tokens, float(burst)))


def share_of(limit: float, held: int, shards: int) -> float:
    """A replica's part of a limit: in proportion to the shards it holds (the whole limit while
    it holds none: it then drives no saga, and a tool it runs is alone)."""
    return limit * held / shards if shards and held else limit


def in_flight_share(limits: Limits | None, held: int, shards: int) -> int:
    """A replica's calls in flight to one participant: its share of spec.limits.inFlight (else
    the default), and at least one, so a replica holding a shard can always make progress."""
    limit = (limits.in_flight if limits is not None else None) or DEFAULT_IN_FLIGHT
    return max(1, math.floor(share_of(limit, held, shards)))
