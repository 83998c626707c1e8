"""The operator's parts take their time from one clock seam (conventions.Clock): a test's own
clock makes hours pass at once."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tests.support.fakes import FixedFence, ManualClock
from tests.support.waiting import eventually
from tests.unit.operator.harness import NS, Operator
from undolog.api import Saga
from undolog.calls.pace import Rate
from undolog.controller.retention import Retention
from undolog.conventions import timestamp
from undolog.decisions.retention import RetentionPolicy, plan


async def test_a_saga_past_its_deadline_on_the_driver_s_clock_is_failed_and_undone(operator: Operator) -> None:
    saga = operator.saga("late", activeDeadlineSeconds=3600)
    operator.entry(saga, 1)
    created = datetime.fromisoformat(saga["metadata"]["creationTimestamp"].replace("Z", "+00:00"))
    operator.context.clock = ManualClock(created + timedelta(minutes=59))
    assert (await operator.drive("late")).status.phase == "Active"
    operator.context.clock = ManualClock(created + timedelta(hours=2))
    done = await operator.drive("late")
    succeeded = next(c for c in done.status.conditions if c.type == "Succeeded")
    assert (done.status.phase, succeeded.reason) == ("Compensated", "DeadlineExceeded")
    assert operator.undone() == [1]


async def test_a_finished_saga_is_deleted_once_retention_s_clock_passes_its_expiry(operator: Operator) -> None:
    operator.saga("s", phase="Completed")
    await operator.kube.patch("sagas", NS, "s", {"metadata": {"finalizers": None}})
    done = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    status = {"completionTime": timestamp(done), "expiresAt": timestamp(done + timedelta(hours=1))}
    body = await operator.kube.patch_status("sagas", NS, "s", {"status": status})
    clock = ManualClock(done + timedelta(minutes=59))
    policy = RetentionPolicy(completed=timedelta(hours=1))
    retention = Retention(operator.context.ledger, policy, FixedFence(), Rate(1000), clock=clock)
    retention.saga_seen(Saga.model_validate(body))
    kept = list(retention.kept.values())
    assert retention.stamps == {}  # its status says the time its TTL gives
    assert plan(kept, policy, clock.now()).due == []
    clock.advance(120)
    assert [d.saga.name for d in plan(kept, policy, clock.now()).due] == ["s"]
    retention.start()
    try:

        async def gone() -> bool:
            return ("sagas", NS, "s") not in operator.kube.objects

        await eventually(gone, bool, 5, "deleted once the clock passed its expiry")
    finally:
        await retention.stop()
