"""Sends calls to participants: one pooled httpx client per CA bundle, the retry loop.

The runner owns its retries (backoff with full jitter, Retry-After) instead of leaning on
kopf's handler retries, whose delays are measured in tens of seconds. Every attempt is
reported to `on_attempt` before the next one starts, so the caller can record it.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx

from undolog.api.saga import Backoff
from undolog.calls.registry import Target
from undolog.decisions.retry import CallOutcome, Verdict, classify, next_delay

MAX_ERROR_TEXT = 300


@dataclass(frozen=True)
class AttemptRecord:
    number: int
    started_at: datetime
    outcome: CallOutcome
    duration_milliseconds: int
    output: dict[str, Any] | None

    @property
    def error(self) -> str | None:
        """What went wrong, in one line; None for a success."""
        if classify(self.outcome) == "Succeeded":
            return None
        return self.outcome.error or f"HTTP {self.outcome.status_code}"


@dataclass(frozen=True)
class CallResult:
    verdict: Verdict
    attempts: list[AttemptRecord]

    @property
    def last(self) -> AttemptRecord:
        return self.attempts[-1]


OnAttempt = Callable[[AttemptRecord, float | None], Awaitable[None]]


class Runner:
    def __init__(self, *, max_connections: int = 200, rng: random.Random | None = None) -> None:
        self._limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self._clients: dict[str | None, httpx.AsyncClient] = {}
        self._rng = rng or random.Random()

    def _client(self, ca_bundle: str | None) -> httpx.AsyncClient:
        client = self._clients.get(ca_bundle)
        if client is None:
            verify: ssl.SSLContext | bool = True
            if ca_bundle:
                verify = ssl.create_default_context(cadata=base64.b64decode(ca_bundle).decode())
            client = httpx.AsyncClient(verify=verify, limits=self._limits, follow_redirects=False)
            self._clients[ca_bundle] = client
        return client

    async def close(self) -> None:
        for client in self._clients.values():
            await client.aclose()
        self._clients.clear()

    async def attempt(
        self, target: Target, body: dict[str, Any], headers: dict[str, str], number: int
    ) -> AttemptRecord:
        started_at = datetime.now(UTC)
        began = time.monotonic()
        output: dict[str, Any] | None = None
        try:
            response = await self._client(target.ca_bundle).post(
                target.url,
                json=body,
                headers={**target.headers, **headers},
                timeout=target.timeout_seconds,
            )
        except httpx.TimeoutException:
            outcome = CallOutcome(error=f"timed out after {target.timeout_seconds:g} s")
        except httpx.HTTPError as error:
            outcome = CallOutcome(error=f"{type(error).__name__}: {error}"[:MAX_ERROR_TEXT])
        except ssl.SSLError as error:
            outcome = CallOutcome(error=f"TLS: {error}"[:MAX_ERROR_TEXT])
        else:
            outcome = CallOutcome(
                status_code=response.status_code,
                retry_after=response.headers.get("Retry-After"),
                error=None if response.is_success else _error_text(response),
            )
            if response.is_success:
                output = _json_object(response)
        return AttemptRecord(number, started_at, outcome, int((time.monotonic() - began) * 1000), output)

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
    ) -> CallResult:
        """Attempts until success, a permanent failure, or the retries are used up.

        `headers(n)` gives attempt n's headers (Undolog-Attempt changes, the keys do not).
        Attempt numbers continue from `first_attempt`, so a resumed call keeps counting.
        """
        attempts: list[AttemptRecord] = []
        number = first_attempt
        while True:
            record = await self.attempt(target, body, headers(number), number)
            attempts.append(record)
            delay = next_delay(
                record.outcome,
                attempt=number,
                backoff=backoff,
                max_retries=max_retries,
                now=datetime.now(UTC),
                rng=self._rng,
            )
            await on_attempt(record, delay)
            if delay is None:
                return CallResult(classify(record.outcome), attempts)
            await asyncio.sleep(delay)
            number += 1


def _error_text(response: httpx.Response) -> str:
    text = response.text.strip().replace("\n", " ")
    detail = f": {text[:MAX_ERROR_TEXT]}" if text else ""
    return f"HTTP {response.status_code}{detail}"


def _json_object(response: httpx.Response) -> dict[str, Any] | None:
    try:
        parsed = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return parsed if isinstance(parsed, dict) else None
