"""Retry classification and timing: pure, property-tested."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from undolog.api.saga import Backoff
from undolog.decisions.retry import (
    MAX_RETRY_AFTER_SECONDS,
    CallOutcome,
    backoff_cap_seconds,
    classify,
    next_delay,
    retry_after_seconds,
)

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
backoffs = st.builds(
    Backoff,
    initial_milliseconds=st.integers(1, 60_000),
    multiplier=st.floats(1, 10),
    max_milliseconds=st.integers(1, 600_000),
    max_retries=st.integers(0, 100),
)


@given(st.integers(100, 599))
def test_classification_follows_the_wire_protocol(code: int) -> None:
    verdict = classify(CallOutcome(status_code=code))
    if 200 <= code < 300:
        assert verdict == "Succeeded"
    elif code in (408, 409, 429) or code >= 500:  # 409: the Idempotency-Key draft's "still processing"
        assert verdict == "Transient"
    else:
        assert verdict == "Permanent"


def test_errors_without_a_status_are_transient() -> None:
    assert classify(CallOutcome(error="timed out after 10 s")) == "Transient"


@given(backoffs, st.integers(1, 200), st.integers(0, 2**32))
def test_full_jitter_stays_under_the_growing_cap(backoff: Backoff, attempt: int, seed: int) -> None:
    delay = next_delay(
        CallOutcome(status_code=503),
        attempt=attempt,
        backoff=backoff,
        max_retries=None,
        now=NOW,
        rng=random.Random(seed),
    )
    if attempt > backoff.max_retries:
        assert delay is None
    else:
        assert delay is not None
        assert 0 <= delay <= backoff_cap_seconds(backoff, attempt) <= backoff.max_milliseconds / 1000


def test_default_backoff_caps() -> None:
    caps = [backoff_cap_seconds(Backoff(), n) for n in range(1, 8)]
    assert caps == [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0]


@given(st.integers(0, 10), st.integers(0, 10))
def test_the_calls_max_retries_wins_over_the_saga(call_retries: int, attempt: int) -> None:
    delay = next_delay(
        CallOutcome(status_code=500),
        attempt=attempt + 1,
        backoff=Backoff(max_retries=50),
        max_retries=call_retries,
        now=NOW,
        rng=random.Random(0),
    )
    assert (delay is None) == (attempt + 1 > call_retries)


@given(st.sampled_from([200, 204, 400, 401, 403, 404, 410, 422]))  # 422: a key reused with another body
def test_no_retry_after_success_or_permanent_failure(code: int) -> None:
    outcome = CallOutcome(status_code=code)
    assert next_delay(outcome, attempt=1, backoff=Backoff(), max_retries=None, now=NOW, rng=random.Random()) is None


@pytest.mark.parametrize("code", [409, 429, 503])
def test_retry_after_is_waited_for_in_seconds_and_dates(code: int) -> None:
    def delay(header: str | None) -> float | None:
        outcome = CallOutcome(status_code=code, retry_after=header)
        return next_delay(outcome, attempt=1, backoff=Backoff(), max_retries=None, now=NOW, rng=random.Random(1))

    assert delay("7") == 7.0
    assert delay(format_datetime(NOW + timedelta(seconds=30), usegmt=True)) == 30.0
    assert delay(format_datetime(NOW - timedelta(seconds=30), usegmt=True)) == 0.0
    assert delay("99999") == MAX_RETRY_AFTER_SECONDS
    fallback = delay("soon")
    assert fallback is not None
    assert fallback <= 0.1  # unusable header: the ordinary backoff


@given(st.text(max_size=30))
def test_retry_after_parsing_never_raises(header: str) -> None:
    value = retry_after_seconds(header, NOW)
    assert value is None or 0 <= value <= MAX_RETRY_AFTER_SECONDS
