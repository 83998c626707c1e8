"""Per-caller limits (`limits`): tools/call requests a second, with a burst (the token bucket
the operator paces its participants with), and sagas open at once, counted in the ledger when
a caller opens another. Kept in each replica's memory, by principal (callers without one share
one bucket)."""

from __future__ import annotations

import time
from collections import OrderedDict

from undolog.api import Saga, SagaPhase
from undolog.api.gateway import CallerLimits
from undolog.decisions.outage import Bucket
from undolog.errors import UndoLogError
from undolog.inspect import field_value
from undolog.kube import Kube
from undolog.ledger import Ledger

KNOWN_CALLERS = 10_000  # buckets kept (the least recent forgotten first: a forgotten one starts full)
OPEN = (None, SagaPhase.ACTIVE, SagaPhase.REWINDING)


class LimitReached(UndoLogError):
    """A caller is past one of its limits: nothing was called."""


class Limits:
    def __init__(self, limits: CallerLimits, kube: Kube) -> None:
        self.limits, self.kube = limits, kube
        self.buckets: OrderedDict[str, Bucket] = OrderedDict()

    def called(self, who: str | None) -> None:
        """A tools/call of `who`; LimitReached when it is past its calls a second."""
        rate = self.limits.calls_per_second
        if rate is None:
            return
        burst = self.limits.burst or max(1, round(rate))
        now = time.monotonic()
        bucket = self.buckets.pop(who or "", None) or Bucket.full(rate, burst, now)
        self.buckets[who or ""], wait = bucket.take(now)
        while len(self.buckets) > KNOWN_CALLERS:
            self.buckets.popitem(last=False)
        if wait > 0:
            raise LimitReached(
                f"{who or 'this caller'} is past its {rate:g} calls a second (limits.callsPerSecond, burst {burst}): "
                f"try again in {wait:.2f} s; nothing was called"
            )

    async def opening(self, who: str | None, namespace: str) -> None:
        """`who` opens a saga in `namespace`; LimitReached when it has limits.openSagas open there."""
        limit = self.limits.open_sagas
        if limit is None or who is None:
            return
        listed, _ = await Ledger(self.kube).sagas(namespace, field_selector=f"spec.principal={field_value(who)}")
        open_now = [s for s in listed if isinstance(s, Saga) and s.status.phase in OPEN and s.spec.outcome is None]
        if len(open_now) >= limit:
            raise LimitReached(
                f"{who} has {len(open_now)} sagas open in {namespace} (limits.openSagas {limit}): commit or abort one "
                "first; nothing was called"
            )
