"""A participant's breaker, pace and outage budget: the pure decisions (decisions.outage) and the
runner waiting through them (calls.pace), on a scripted transport."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import TypeVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support.fakes import FakeTransport
from tests.support.waiting import eventually
from undolog.api import Backoff, EntryReason, Limits
from undolog.calls.http import ParticipantSlots
from undolog.calls.pace import Pacing
from undolog.calls.runner import AttemptRecord, Runner, Unfenced
from undolog.calls.transport import PreparedCall, Target
from undolog.controller.participants import budget_in_force
from undolog.decisions import outage
from undolog.decisions.outage import OPEN_AFTER, Breaker, Bucket, unanswered
from undolog.decisions.retry import CallOutcome, Verdict

T = TypeVar("T")

REFUSED = CallOutcome(error="ClientConnectorError: connection refused")


@pytest.mark.parametrize(
    ("outcome", "did_not_answer"),
    [
        (REFUSED, True),
        (CallOutcome(error="timed out after 10 s"), True),
        (CallOutcome(error="TLS: expired", certificate="expired"), True),
        (CallOutcome(status_code=503), True),
        (CallOutcome(status_code=502), True),
        (CallOutcome(status_code=504), True),
        (CallOutcome(status_code=500), False),
        (CallOutcome(status_code=429), False),
        (CallOutcome(status_code=404), False),
        (CallOutcome(status_code=200), False),
        (CallOutcome(error="refused by policy", refusal=EntryReason.TARGET_REFUSED), False),
    ],
)
def test_what_counts_as_the_participant_not_answering(outcome: CallOutcome, did_not_answer: bool) -> None:
    assert unanswered(outcome) is did_not_answer


def test_the_breaker_opens_after_failures_in_a_row_probes_one_at_a_time_backing_off_to_a_minute() -> None:
    breaker = Breaker()
    for _ in range(OPEN_AFTER - 1):
        breaker = breaker.unanswered(0.0, probe=False)
    assert not breaker.open
    assert breaker.answered() == Breaker()  # an answer in between starts the count again
    breaker = breaker.unanswered(10.0, probe=False)
    assert breaker.open
    assert breaker.wait(10.0) == 1.0
    assert breaker.wait(11.0) == 0.0
    probing = breaker.probe()
    assert probing.wait(11.0) is None  # nobody else goes while the probe is out
    assert probing.unanswered(11.5, probe=False) == probing  # a late call's failure sets no pace
    delays = []
    at = 11.0
    for _ in range(9):
        breaker = breaker.probe().unanswered(at, probe=True)
        delays.append(breaker.probe_at - at)
        at = breaker.probe_at
    assert delays == [2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0, 60.0, 60.0]
    assert not breaker.probe().answered().open


@given(
    rate=st.floats(0.5, 200),
    burst=st.integers(1, 20),
    gaps=st.lists(st.floats(0, 0.5), min_size=1, max_size=200),
)
def test_in_any_window_no_more_calls_leave_than_the_burst_and_the_rate_allow(
    rate: float, burst: int, gaps: list[float]
) -> None:
    bucket, now, leaving = Bucket.full(rate, burst, 0.0), 0.0, []
    for gap in gaps:  # callers arriving `gap` apart, each trying again when told, a little late
        now += gap
        bucket, wait = bucket.take(now)
        while wait > 0:
            now += wait + gap / 10
            bucket, wait = bucket.take(now)
        leaving.append(now)
    for i, start in enumerate(leaving):
        window = [t for t in leaving[i:] if t - start <= 1.0]
        assert len(window) <= burst + rate * 1.0 + 1e-6


def target(**limits: float) -> Target:
    return Target(
        url="http://127.0.0.1:1/refund",
        timeout_seconds=5,
        participant="ns/refund",
        limits=Limits.model_validate(limits) if limits else None,
        outage_budget_seconds=30,
    )


class Outage(FakeTransport):
    """Refuses connections until `back` is set; counts calls in flight at once."""

    def __init__(self) -> None:
        super().__init__()
        self.back = False
        self.in_flight = self.most_in_flight = 0
        self.while_down: list[int] = []  # calls in flight whenever a refused call arrived

    async def send(self, call: PreparedCall) -> CallOutcome:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            self.sent.append(call)
            await asyncio.sleep(0.005)
            if not self.back:
                self.while_down.append(self.in_flight)
                return REFUSED
            return CallOutcome(status_code=200)
        finally:
            self.in_flight -= 1


async def calls(runner: Runner, called: Target, n: int) -> list[Verdict]:
    async def one() -> Verdict:
        async def noted(record: AttemptRecord, delay: float | None) -> None:
            return None

        backoff = Backoff(initial_milliseconds=10, max_milliseconds=20, max_retries=0)
        result = await runner.call(
            called, {}, lambda n: {}, backoff=backoff, max_retries=0, on_attempt=noted, patient=True
        )
        return result.verdict

    return list(await asyncio.gather(*(one() for _ in range(n))))


async def test_sagas_wait_out_an_outage_with_one_probe_at_a_time_and_spend_no_retries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(outage, "FIRST_PROBE_SECONDS", 0.05)
    monkeypatch.setattr(outage, "MAX_PROBE_SECONDS", 0.2)
    transport = Outage()
    runner = Runner(transport, Unfenced())
    waiting = asyncio.ensure_future(calls(runner, target(), 50))

    async def probes_refused() -> int:
        breaker = runner.pacing.breaker("ns/refund")
        return breaker.failed_probes if breaker.open else 0

    await eventually(probes_refused, lambda refused: refused >= 3, 10, "the breaker open and 3 probes refused")
    down = len(transport.sent)
    transport.back = True
    assert await asyncio.wait_for(waiting, 10) == [Verdict.SUCCEEDED] * 50  # maxRetries 0, none halted
    assert all(n == 1 for n in transport.while_down[OPEN_AFTER * 10 :])  # once open: only the probe
    assert down < 50 + 20  # not 50 sagas retrying on their own
    assert not runner.pacing.breaker("ns/refund").open


async def test_past_its_outage_budget_a_call_is_unavailable_and_says_so() -> None:
    transport = Outage()
    runner = Runner(transport, Unfenced())
    short = Target(url="http://127.0.0.1:1/refund", timeout_seconds=1, participant="ns/refund", outage_budget_seconds=1)
    records: list[AttemptRecord] = []

    async def noted(record: AttemptRecord, delay: float | None) -> None:
        records.append(record)

    backoff = Backoff(initial_milliseconds=50, max_milliseconds=100, max_retries=0)
    began = time.monotonic()
    result = await runner.call(short, {}, lambda n: {}, backoff=backoff, max_retries=0, on_attempt=noted, patient=True)
    assert result.verdict == Verdict.UNAVAILABLE
    assert 1.0 <= time.monotonic() - began < 5
    assert len(records) > 2  # retried past maxRetries 0: an outage spends none
    assert "did not answer for its outage budget (1 s; last: ClientConnectorError" in str(records[-1].error)


async def test_calls_leave_at_the_participants_pace_and_never_more_in_flight_than_its_limit() -> None:
    transport = Outage()
    transport.back = True
    runner = Runner(transport, Unfenced(), pacing=Pacing())
    began = time.monotonic()
    assert await calls(runner, target(calls_per_second=100, burst=5, in_flight=2), 40) == [Verdict.SUCCEEDED] * 40
    assert time.monotonic() - began >= (40 - 5) / 100 * 0.9
    assert transport.most_in_flight <= 2


async def test_a_call_waiting_for_a_place_in_flight_and_its_token_waits_in_its_saga_s_slot() -> None:
    """Given up, each freed slot let one more saga in to wait too: 1,000 sagas on one
    participant held 181.5 MiB instead of 112.0 (bench.scale). A probe is waited for away
    from the slot (bounded: test_slots_and_queue); a place in flight and then a token in it."""
    stepped_away: list[str] = []

    async def away(waiting: Awaitable[T]) -> T:
        stepped_away.append("away")
        return await waiting

    async def second_call(pacing: Pacing, called: Target) -> None:
        async with pacing.turn(called, None):
            pass

    pacing, called = Pacing(away), target(in_flight=1, calls_per_second=5, burst=1)
    async with pacing.turn(called, None):
        waiting = asyncio.create_task(second_call(pacing, called))
        await asyncio.sleep(0.05)
        assert not waiting.done()  # held back: one call in flight at most
    await asyncio.wait_for(waiting, 1)
    assert stepped_away == []


@pytest.mark.parametrize(
    ("held", "shards", "rate", "in_flight"), [(1, 1, 50.0, 10), (1, 4, 12.5, 2), (3, 4, 37.5, 7), (0, 4, 50.0, 10)]
)
def test_each_replica_takes_the_share_of_the_limits_its_shards_are(
    held: int, shards: int, rate: float, in_flight: int
) -> None:
    assert outage.share_of(50, held, shards) == rate
    assert outage.in_flight_share(Limits(in_flight=10), held, shards) == in_flight


def test_the_defaults_of_the_budget_and_the_calls_in_flight_have_one_source() -> None:
    assert outage.in_flight_share(None, 1, 1) == outage.DEFAULT_IN_FLIGHT == ParticipantSlots().limit
    assert outage.outage_budget(None) == outage.DEFAULT_OUTAGE_BUDGET_SECONDS == Target("u", 1).outage_budget_seconds
    assert outage.outage_budget(30) == 30.0
    assert outage.give_up_at(None, 100.0, 30.0) == 130.0
    assert outage.give_up_at(90.0, 100.0, 30.0) == 120.0


async def test_a_forward_call_is_not_held_by_an_outage_and_spends_its_retries() -> None:
    transport = Outage()
    runner = Runner(transport, Unfenced())
    records: list[AttemptRecord] = []

    async def noted(record: AttemptRecord, delay: float | None) -> None:
        records.append(record)

    backoff = Backoff(initial_milliseconds=10, max_milliseconds=20, max_retries=2)
    result = await runner.call(target(), {}, lambda n: {}, backoff=backoff, max_retries=2, on_attempt=noted)
    assert result.verdict == Verdict.TRANSIENT  # retries used up: the saga fails and compensates
    assert len(records) == 3


def test_the_budget_in_force_is_said_as_a_person_reads_it_never_none() -> None:
    assert budget_in_force(None) == "3600 s, the default"
    assert budget_in_force(30) == "30 s"
