"""Many keys at once against a participant: each key's forward call, then its compensation a
moment later (while the forward's effect may still be in flight), all over one HTTP client.
What every call answered and how long it took, for the kit's tests and its benchmark."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field

import httpx

from undolog.calls import protocol
from undolog.conventions import compensation_key, forward_key

CALL_SECONDS = 120.0  # a call unanswered by then counts as stalled


@dataclass
class Load:
    seconds: float = 0.0
    statuses: dict[str, list[int]] = field(default_factory=lambda: {"forward": [], "compensation": []})
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # calls that got no answer

    @property
    def slowest(self) -> float:
        return max(self.latencies, default=0.0)

    def percentile(self, p: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(p * len(ordered)))] if ordered else 0.0


async def keys_at_once(
    base: str, keys: int, compensate_after: float | None = 0.05, repeats: int = 1, effect_seconds: float = 0.0
) -> Load:
    """`keys` forward calls at once (each sent `repeats` times together, each charge awaiting
    `effect_seconds` in its transaction), and each key's compensation `compensate_after` seconds
    after its forward call (None: no compensation)."""
    load = Load()
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=CALL_SECONDS, limits=limits) as client:

        async def call(kind: str, path: str, key: str, body: dict[str, object], forward: str | None) -> None:
            headers = protocol.headers(
                idempotency_key=key, saga="kit/load", step="charge", org=None, attempt=1, forward=forward
            )
            began = time.monotonic()
            try:
                answer = await client.post(f"{base}{path}", json=body, headers=headers)
            except httpx.HTTPError as error:
                load.errors.append(f"{kind} {key}: {type(error).__name__}: {error}")
                return
            load.latencies.append(time.monotonic() - began)
            load.statuses[kind].append(answer.status_code)

        async def one_key(i: int) -> None:
            key = forward_key(str(uuid.uuid4()), "charge")
            body = {"order": f"load-{i}", "amount": 1, "seconds": effect_seconds}
            calls = [call("forward", "/charge", key, body, None) for _ in range(repeats)]
            if compensate_after is None:
                await asyncio.gather(*calls)
                return

            async def compensation() -> None:
                await asyncio.sleep(compensate_after)
                await call("compensation", "/refund", compensation_key(str(uuid.uuid4())), {}, key)

            await asyncio.gather(*calls, compensation())

        began = time.monotonic()
        await asyncio.gather(*(one_key(i) for i in range(keys)))
        load.seconds = time.monotonic() - began
    return load
