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


@dataclass(frozen=True)
class KeyCalls:
    """One key's calls: its forward call (its Idempotency-Key and body), and its compensation's key."""

    forward: str
    body: dict[str, object]
    compensation: str | None


def planned(keys: int, effect_seconds: float = 0.0, compensated: bool = True) -> list[KeyCalls]:
    """`keys` keys, each charge awaiting `effect_seconds` in its transaction."""
    return [
        KeyCalls(
            forward_key(str(uuid.uuid4()), "charge"),
            {"order": f"load-{i}", "amount": 1, "seconds": effect_seconds},
            compensation_key(str(uuid.uuid4())) if compensated else None,
        )
        for i in range(keys)
    ]


@dataclass
class Load:
    seconds: float = 0.0
    statuses: dict[str, list[int]] = field(default_factory=lambda: {"forward": [], "compensation": []})
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # calls that got no answer
    unanswered: list[tuple[str, KeyCalls]] = field(default_factory=list)  # which, to send again
    answered: asyncio.Event = field(default_factory=asyncio.Event)  # set at the first answer

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
    await sent(base, planned(keys, effect_seconds, compensate_after is not None), load, compensate_after or 0, repeats)
    return load


async def sent(base: str, plan: list[KeyCalls], load: Load, compensate_after: float = 0.05, repeats: int = 1) -> None:
    """Every key's calls at once, each compensation `compensate_after` seconds after its
    forward call; what each answered recorded in `load`."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=CALL_SECONDS, limits=limits) as client:

        async def one_key(calls: KeyCalls) -> None:
            forwards = [_call(client, base, load, "forward", calls) for _ in range(repeats)]

            async def compensation() -> None:
                await asyncio.sleep(compensate_after)
                await _call(client, base, load, "compensation", calls)

            await asyncio.gather(*forwards, *([compensation()] if calls.compensation else []))

        began = time.monotonic()
        await asyncio.gather(*(one_key(calls) for calls in plan))
        load.seconds = time.monotonic() - began


async def sent_again(base: str, unanswered: list[tuple[str, KeyCalls]]) -> Load:
    """What got no answer sent again under the same keys (as the operator retries), each key's
    forward call before its compensation, keys at once."""
    load = Load()
    by_key: dict[str, list[str]] = {}
    for kind, calls in unanswered:
        by_key.setdefault(calls.forward, []).append(kind)
    plan = {calls.forward: calls for _, calls in unanswered}
    async with httpx.AsyncClient(timeout=CALL_SECONDS) as client:

        async def one_key(key: str) -> None:
            for kind in sorted(by_key[key], key=lambda k: k != "forward"):
                await _call(client, base, load, kind, plan[key])

        await asyncio.gather(*(one_key(key) for key in by_key))
    return load


async def _call(client: httpx.AsyncClient, base: str, load: Load, kind: str, calls: KeyCalls) -> None:
    forward = kind == "compensation"
    key = calls.compensation if forward and calls.compensation else calls.forward
    headers = protocol.headers(
        idempotency_key=key,
        saga="kit/load",
        step="charge",
        org=None,
        attempt=1,
        forward=calls.forward if forward else None,
    )
    path, body = ("/refund", {}) if forward else ("/charge", calls.body)
    began = time.monotonic()
    try:
        answer = await client.post(f"{base}{path}", json=body, headers=headers)
    except httpx.HTTPError as error:
        load.errors.append(f"{kind} {key}: {type(error).__name__}: {error}")
        load.unanswered.append((kind, calls))
        return
    load.latencies.append(time.monotonic() - began)
    load.statuses[kind].append(answer.status_code)
    load.answered.set()
