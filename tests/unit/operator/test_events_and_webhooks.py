"""What is said in Events, and call targets from the Webhook cache."""

from __future__ import annotations

from tests.unit.operator.harness import NS, Operator
from undolog.api import (
    EventReason,
    Saga,
    SagaPhase,
    Webhook,
)
from undolog.api.events import SUCCESSES
from undolog.calls.webhook_cache import WebhookCache
from undolog.controller.timeline import Timeline
from undolog.decisions.retry import CallOutcome


def cached(operator: Operator, url: str) -> WebhookCache:
    """A Webhook cache holding `undo` at `url`, whatever the API holds (a watch lagging or not)."""
    cache = WebhookCache(operator.kube, [NS])  # type: ignore[arg-type]
    body = operator.kube.body("webhooks", NS, "undo")
    stale = {**body, "spec": {**body["spec"], "versions": [{"name": "v1", "url": url}]}}
    cache.webhooks[(NS, "undo")] = Webhook.model_validate(stale)
    operator.context.compensator.recorder.registry.cache = cache
    return cache


async def test_successes_the_status_records_are_not_events_unless_asked_for(operator: Operator) -> None:
    """A compensation of 3 entries posts one Event by default, its Failed Warning: the calls and
    the end are in the status with their times. Every Warning and other phase change stays."""
    quiet = Timeline(operator.kube, quiet=SUCCESSES)
    quiet.start()
    saga = Saga.model_validate(operator.saga("q"))
    quiet.record(saga, SagaPhase.FAILED, "Aborted: spec.outcome is Abort; undoing 3 entries", warning=True)
    quiet.record(saga, EventReason.ENTRY_COMPENSATED, "q-1: HTTP 200")
    quiet.record(saga, EventReason.COMPENSATION_FAILED, "q-2: HTTP 400", warning=True)
    quiet.record(saga, SagaPhase.HALTED, "CompensationFailed: q-2", warning=True)
    quiet.record(saga, SagaPhase.ACTIVE, "Rewound: back to position 1")
    quiet.record(saga, SagaPhase.COMPENSATED, "Compensated: 2 entries")
    quiet.record(saga, SagaPhase.COMPLETED, "Committed")
    await quiet.stop(drain_seconds=1)
    assert [reason for _, reason, _ in operator.kube.events] == ["Failed", "CompensationFailed", "Halted", "Active"]


async def test_compensation_targets_come_from_the_webhook_cache_without_a_read(operator: Operator) -> None:
    cached(operator, "http://participant.test/undo")
    operator.aborted("s", 3)
    done = await operator.drive("s")
    assert done.status.phase == "Compensated"
    assert operator.undone() == [3, 2, 1]
    assert ("get", "webhooks") not in operator.kube.requests


async def test_a_call_failed_on_a_stale_cached_webhook_is_made_again_at_the_apis_target(operator: Operator) -> None:
    """A person fixed the Webhook; the cache has not heard yet. The failure is checked against
    the API before it is recorded, and the call goes to the fixed target: no halt."""
    cached(operator, "http://participant.test/old")
    operator.transport.script("/old", CallOutcome(status_code=404, error="HTTP 404: no such route"))
    operator.aborted("s", 1)
    done = await operator.drive("s")
    assert done.status.phase == "Compensated"
    assert operator.transport.paths() == ["/old", "/undo"]
    assert [c.headers["Undolog-Attempt"] for c in operator.transport.sent] == ["1", "2"]
    keys = {c.headers["Idempotency-Key"] for c in operator.transport.sent}
    assert len(keys) == 1
    entry = operator.kube.body("undoentries", NS, "s-1")["status"]
    assert [a.get("statusCode") for a in entry["attempts"]] == [404, 200]
    assert any("its Webhook changed" in message for _, _, message in operator.kube.events)


async def test_a_failure_on_a_cached_webhook_that_is_still_current_is_recorded_as_it_was(operator: Operator) -> None:
    cached(operator, "http://participant.test/undo")
    operator.transport.script("/undo", CallOutcome(status_code=400, error="HTTP 400: unknown grant"))
    operator.aborted("s", 1)
    halted = await operator.drive("s")
    assert halted.status.phase == "Halted"
    assert operator.transport.paths() == ["/undo"]  # the API agreed with the cache: not sent again
