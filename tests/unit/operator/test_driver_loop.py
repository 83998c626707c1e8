"""The driver's loop: its copy of the saga, the Lease in doubt, errors, cancellation, the fence."""

from __future__ import annotations

import asyncio

import pytest

from tests.unit.operator.harness import NS, Operator
from undolog import errors
from undolog.api import (
    EventReason,
    Saga,
)
from undolog.calls.transport import PreparedCall
from undolog.controller.concurrency import woken
from undolog.controller.driver import SagaDriver


async def test_a_driver_holds_the_newest_copy_of_its_saga_as_it_was(operator: Operator) -> None:
    """Memory: the copy a resting driver holds is kept as JSON (one queued behind others for a
    slot, or waiting with nothing to do); what it gives back equals what it was given. One that
    runs at once holds it parsed, never dumped and parsed again in between."""
    operator.aborted("s", 1)
    done = await operator.drive("s")  # conditions, times, counters: a full status
    driver = SagaDriver(operator.context, NS, "s")

    def at(version: str) -> Saga:
        return done.model_copy(update={"metadata": done.metadata.model_copy(update={"resource_version": version})})

    driver.notify(done)  # out of its slot: held as JSON
    assert driver.copy.as_json
    driver.notify(at("1"))  # an older event arriving late
    assert driver.latest == done
    newer = at("99999999")
    driver.notify(newer)
    driver.copy.rest(False)  # in its slot: parsed
    assert not driver.copy.as_json
    assert driver.latest == newer
    driver.copy.rest(True)  # waiting for a wake
    assert driver.copy.as_json
    assert driver.latest == newer
    first_in_line = SagaDriver(operator.context, NS, "s", resting=False)
    first_in_line.notify(done)
    assert not first_in_line.copy.as_json
    assert first_in_line.latest == done
    assert driver.copy.keep_newest(at("not-a-number")) is None  # cannot be ordered: read again
    assert driver.latest is None


async def test_a_replaced_leader_sends_nothing(operator: Operator) -> None:
    operator.fence.leading = False
    operator.aborted("s", 1)
    with pytest.raises(errors.NotLeading):
        await operator.drive("s")
    assert operator.transport.sent == []
    assert operator.kube.body("sagas", NS, "s")["status"]["phase"] == "Active"


async def test_a_driver_that_finds_the_lease_in_doubt_waits_and_carries_on(operator: Operator) -> None:
    """A late renewal under load puts the Lease in doubt for a moment: the driver sends nothing
    meanwhile, and neither gives its saga up (no one else would drive it)."""
    operator.fence.leading = False
    operator.aborted("s", 1)
    driving = asyncio.create_task(SagaDriver(operator.context, NS, "s").run())
    await asyncio.sleep(0.3)  # a moment in doubt: nothing may be sent
    assert operator.transport.sent == []
    assert not driving.done()
    operator.fence.leading = True
    await asyncio.wait_for(driving, timeout=5)
    assert operator.kube.body("sagas", NS, "s")["status"]["phase"] == "Compensated"
    assert len(operator.transport.sent) == 1


async def test_an_unexpected_error_is_said_on_its_saga_and_retried_not_the_end_of_its_driver(
    operator: Operator, caplog: pytest.LogCaptureFixture
) -> None:
    """A defect, or input nobody foresaw, raised inside a reconcile (here by the transport): the
    saga says so in a Warning Event, the log has the traceback, and the driver tries again with
    backoff. Before, the driver's task ended with it and the saga stayed Compensating in silence."""
    operator.aborted("s", 1)
    raised: list[PreparedCall] = []

    def defect(call: PreparedCall) -> None:
        if not raised:
            raised.append(call)
            raise RuntimeError("a defect nobody foresaw")

    operator.transport.on_send = defect
    driving = asyncio.create_task(SagaDriver(operator.context, NS, "s").run())
    await asyncio.wait_for(driving, timeout=5)  # the first retry comes after 1 s
    assert operator.kube.body("sagas", NS, "s")["status"]["phase"] == "Compensated"
    assert len(operator.transport.sent) == 2  # sent again under the same key
    assert len({c.headers["Idempotency-Key"] for c in operator.transport.sent}) == 1
    await operator.timeline.stop(drain_seconds=1)
    said = [message for _, reason, message in operator.kube.events if reason == EventReason.OPERATOR_ERROR]
    assert said == ["unexpected RuntimeError in the operator: a defect nobody foresaw; retrying with backoff"]
    assert any(r.exc_info and r.exc_info[0] is RuntimeError for r in caplog.records)


async def test_a_driver_woken_and_cancelled_at_once_stops() -> None:
    """Stopping the engine cancels every driver while events still wake them; a cancellation
    that arrives with a wake-up must end the driver's wait (asyncio.wait_for on 3.11 returned
    normally instead, the driver looped on, and the engine never stopped)."""
    wake = asyncio.Event()
    waiting = asyncio.create_task(woken(wake, 30))
    await asyncio.sleep(0)  # the task is waiting
    wake.set()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert waiting.cancelled()
