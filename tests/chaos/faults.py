"""A participant that misbehaves on purpose, and idempotently: timeouts, connection resets,
bursts of 503, 429 with Retry-After, garbage bodies, very slow answers, answers that trickle
one byte at a time forever, and huge answers. Decisions come from a seeded random generator,
so a failing run can be replayed."""

from __future__ import annotations

import random
import threading
from collections import Counter
from dataclasses import dataclass, field

from tests.support.participants import Received, Reply

TIMEOUT_SECONDS = 2  # the chaos Webhooks' spec.timeoutSeconds
HUGE_ANSWER_BYTES = 64 * 1024 * 1024  # succeeds: the effect happened; the answer is not read
FAULTS = ("timeout", "reset", "burst", "throttled", "garbage", "slow", "drip", "huge")


@dataclass
class Faults:
    seed: int
    rate: float = 0.25  # share of requests that misbehave
    injected: Counter[str] = field(default_factory=Counter)
    applied: set[str] = field(default_factory=set)  # keys whose effect took place (idempotency)
    _burst: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def handler(self, request: Received) -> Reply:
        with self._lock:
            fault = self._choose()
            if fault is None:
                self.applied.add(request.key)  # a repeat of a key changes nothing more
                if isinstance(request.body, dict) and request.body.get("fail"):
                    return Reply(400, {"error": "this step is refused"})
                return Reply(200, {"ok": True, "key": request.key})
            self.injected[fault] += 1
        match fault:
            case "timeout":
                return Reply(200, delay=TIMEOUT_SECONDS + 0.5)
            case "reset":
                return Reply(reset=True)
            case "burst":
                return Reply(503, {"error": "overloaded"})
            case "throttled":
                return Reply(429, {"error": "slow down"}, headers={"Retry-After": "1"})
            case "garbage":
                # A 5xx with a body that is not JSON: the caller must cope and retry.
                return Reply(502, raw=b"<html>\x00\xff bad gateway")
            case "drip":
                # One byte every 0.3 s, forever: only the attempt's own time limit ends it.
                return Reply(200, drip=0.3)
            case "huge":
                self.applied.add(request.key)
                return Reply(200, size=HUGE_ANSWER_BYTES)
            case _:  # slow, but within the timeout: succeeds
                self.applied.add(request.key)
                return Reply(200, {"ok": True}, delay=self._rng.uniform(0.3, TIMEOUT_SECONDS - 0.8))

    def _choose(self) -> str | None:
        if self._burst:
            self._burst -= 1
            return "burst"
        if self._rng.random() >= self.rate:
            return None
        fault = self._rng.choice(FAULTS)
        if fault == "burst":
            self._burst = self._rng.randint(1, 3)
        return fault
