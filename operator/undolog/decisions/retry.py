"""Classifying a call's outcome and timing the next attempt; timing the operator's own retries.

2xx succeeds. 429 retries after Retry-After (seconds or an HTTP date). 408, 409, 5xx,
timeouts and connection errors retry with exponential backoff and full jitter (after
Retry-After when a 409 or 503 gives one), except a 409 whose JSON body names a `conflict`: the
participant refuses the undo because what the step left has changed since, which no retry
mends (a Conflict, for a person). Any other status is permanent, and so is a call refused before
anything was sent. Retries stop after max_retries (the Call's value wins over
the saga's backoff).

409 is how a participant that keeps the Idempotency-Key draft (draft-ietf-httpapi-idempotency-
key-header) answers a retry that arrives while the first request under its key is still being
processed, "to be retried as is": what an attempt that timed out leaves behind.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from enum import StrEnum
from typing import Any

from undolog.api import Backoff, EntryReason, OmittedOutput

RETRIED = frozenset({408, 409, 429})  # besides 5xx
WAITS_AS_TOLD = frozenset({409, 429, 503})  # Retry-After honoured
MAX_RETRY_AFTER_SECONDS = 300.0  # a participant cannot park a compensation for longer per attempt
MAX_OPERATOR_RETRY_SECONDS = 30.0


class Verdict(StrEnum):
    SUCCEEDED = "Succeeded"
    TRANSIENT = "Transient"
    PERMANENT = "Permanent"
    UNAVAILABLE = "Unavailable"  # a call's result only: the participant did not answer for its outage budget


@dataclass(frozen=True)
class CallOutcome:
    """What one attempt produced, whatever the transport: a status, or an error before any came
    back, or a refusal (nothing was sent)."""

    status_code: int | None = None
    error: str | None = None
    retry_after: str | None = None  # the raw Retry-After header, if any
    refusal: EntryReason | None = None  # refused before any byte left (say, by the egress policy)
    output: dict[str, Any] | None = None  # a 2xx answer's JSON object
    omitted: OmittedOutput | None = None  # a 2xx answer that is not kept as output, and why
    certificate: str | None = None  # the participant's certificate was rejected (why): retried, it may be renewed
    # A transport's own verdict on an answer its protocol says more of than a status (an MCP
    # tool's isError or JSON-RPC error, which come back with HTTP 200).
    verdict: Verdict | None = None
    conflict: bool = False  # the participant refused it as a conflict with a later change (a 409 naming it)
    state: Any = None  # a 2xx answer as a guard reads it: any JSON value (an MCP tool's as the gateway reads it)


def names_conflict(status: int, body: bytes) -> bool:
    """A 409 whose body is a JSON object with a `conflict` member: the participant says the
    state changed since the step (a 409 without it is the Idempotency-Key draft's "in progress")."""
    if status != 409:
        return False
    try:
        parsed = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return False
    return isinstance(parsed, dict) and "conflict" in parsed


def classify(outcome: CallOutcome) -> Verdict:
    if outcome.refusal is not None:
        return Verdict.PERMANENT
    if outcome.verdict is not None:
        return outcome.verdict
    code = outcome.status_code
    if code is None:  # timeout, refused or reset connection, TLS failure: the network may heal
        return Verdict.TRANSIENT
    if 200 <= code < 300:
        return Verdict.SUCCEEDED
    if code in RETRIED or code >= 500:
        return Verdict.TRANSIENT
    return Verdict.PERMANENT


def retry_after_seconds(header: str | None, now: datetime) -> float | None:
    """Seconds to wait from a Retry-After header: delta-seconds or an HTTP date; None if unusable."""
    if header is None:
        return None
    value = header.strip()
    if value.isascii() and value.isdigit():
        return min(float(value), MAX_RETRY_AFTER_SECONDS)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return min(max((when - now).total_seconds(), 0.0), MAX_RETRY_AFTER_SECONDS)


def backoff_cap_seconds(backoff: Backoff, retry_number: int) -> float:
    """Upper bound of the delay before retry `retry_number` (1 for the first retry)."""
    # The exponent capped: an outage retries without end, and 2.0**1024 overflows a float.
    cap_ms = backoff.initial_milliseconds * backoff.multiplier ** min(retry_number - 1, 64)
    return min(cap_ms, backoff.max_milliseconds) / 1000.0


def next_delay(
    outcome: CallOutcome,
    *,
    attempt: int,
    backoff: Backoff,
    max_retries: int | None,
    now: datetime,
    rng: random.Random,
) -> float | None:
    """Seconds to wait before the next attempt after `attempt` (1-based) ended with `outcome`,
    or None when there is no next attempt (success, permanent failure, retries used up)."""
    if classify(outcome) != Verdict.TRANSIENT:
        return None
    allowed = backoff.max_retries if max_retries is None else max_retries
    if attempt > allowed:
        return None
    if outcome.status_code in WAITS_AS_TOLD:
        waited = retry_after_seconds(outcome.retry_after, now)
        if waited is not None:
            return waited
    return rng.uniform(0.0, backoff_cap_seconds(backoff, attempt))  # full jitter


def operator_retry_seconds(failures: int) -> float:
    """Delay before the operator tries a saga again after `failures` failures of its own in a
    row (the API unreachable, a write refused): doubling from 1 s, capped."""
    return min(2.0 ** (max(failures, 1) - 1), MAX_OPERATOR_RETRY_SECONDS)
