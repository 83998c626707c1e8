"""Orchestrated sagas going forward: registering each step before its call, outputs, effects."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from tests.support.waiting import eventually
from tests.unit.operator.harness import FAST, NS, Operator
from undolog import errors
from undolog.api import (
    EntryReason,
    OmittedOutput,
    OutputOmission,
    Saga,
    SagaPhase,
)
from undolog.calls.transport import PreparedCall
from undolog.conventions import FINALIZER
from undolog.decisions import phases
from undolog.decisions.retry import CallOutcome
from undolog.kube import Body


def fresh_orchestrated(operator: Operator, name: str, functions: list[str]) -> Body:
    """An orchestrated saga as `kubectl apply` leaves it: just created, no status, no finalizer."""
    steps = [
        {"name": f"step{i}", "action": {"function": function}, "compensation": {"function": "undo"}}
        for i, function in enumerate(functions, start=1)
    ]
    for function in set(functions):
        operator.webhook(function)
    return operator.kube.put(
        "sagas",
        {
            "apiVersion": "undolog.io/v1beta1",
            "kind": "Saga",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"compensationPolicy": FAST, "steps": steps},
        },
    )


async def test_orchestrated_steps_run_in_order_with_outputs_flowing(operator: Operator) -> None:
    operator.webhook("create")
    operator.webhook("grant")
    operator.transport.script("/create", CallOutcome(status_code=200, output={"user_id": "u-7"}))
    steps = [
        {"name": "create", "action": {"function": "create"}, "compensation": {"function": "undo"}},
        {
            "name": "grant",
            "action": {"function": "grant", "args": {"user": "${steps.create.output.user_id}"}},
            "compensation": {"function": "undo"},
        },
    ]
    saga = operator.saga("o", steps=steps)
    done = await operator.drive("o")
    assert done.status.phase == "Completed"
    assert operator.transport.paths() == ["/create", "/grant"]
    assert operator.transport.sent[1].body == {"user": "u-7"}
    assert operator.transport.sent[0].headers["Idempotency-Key"] == f"{saga['metadata']['uid']}:create:fwd"
    assert operator.kube.body("undoentries", NS, "o-1")["status"]["output"] == {"user_id": "u-7"}


async def test_a_null_in_an_output_is_kept_and_flows_to_the_next_step(operator: Operator) -> None:
    """A merge patch takes a null inside an object as "delete the key": `"parent": null` was
    stored without `parent`, and the next step's reference to it failed the saga."""
    operator.webhook("create")
    operator.webhook("grant")
    operator.transport.script("/create", CallOutcome(status_code=200, output={"user_id": "u-7", "parent": None}))
    steps = [
        {"name": "create", "action": {"function": "create"}, "compensation": {"function": "undo"}},
        {
            "name": "grant",
            "action": {"function": "grant", "args": {"parent": "${steps.create.output.parent}"}},
            "compensation": {"function": "undo"},
        },
    ]
    operator.saga("o", steps=steps)
    done = await operator.drive("o")
    assert done.status.phase == "Completed"
    assert operator.transport.sent[1].body == {"parent": None}
    assert operator.kube.body("undoentries", NS, "o-1")["status"]["output"] == {"user_id": "u-7", "parent": None}


async def test_a_step_whose_call_never_left_is_not_compensated(operator: Operator) -> None:
    operator.webhook("create")
    steps = [
        {"name": "create", "action": {"function": "create"}, "compensation": {"function": "undo", "args": {"n": 1}}},
        {
            "name": "grant",
            "action": {"function": "unregistered"},
            "compensation": {"function": "undo", "args": {"n": "${steps.grant.output.id}"}},
        },
    ]
    operator.saga("o", steps=steps)
    done = await operator.drive("o")
    assert (done.status.phase, done.status.failed_step) == ("Compensated", "grant")
    assert operator.transport.paths() == ["/create", "/undo"]  # never {"n": null} for the step never sent
    assert operator.undone() == [1]
    never = operator.kube.body("undoentries", NS, "o-2")["status"]
    assert (never["effect"], never["state"], never["reason"]) == ("NotSent", "Skipped", "NotSent")
    assert "no Webhook 'unregistered'" in never["skipReason"]
    assert done.status.compensated_count == 2


async def test_a_target_refused_on_the_first_send_is_never_sent(operator: Operator) -> None:
    operator.webhook("create")
    refused = CallOutcome(error="127.0.0.1:80 is refused by the egress policy", refusal=EntryReason.TARGET_REFUSED)
    operator.transport.script("/create", refused)
    steps = [{"name": "create", "action": {"function": "create"}, "compensation": {"function": "undo"}}]
    operator.saga("o", steps=steps)
    done = await operator.drive("o")
    assert done.status.phase == "Compensated"
    assert operator.transport.paths() == ["/create"]  # refused before any byte left; nothing to undo
    assert operator.state("o-1") == ("NotSent", "Skipped")


async def test_a_step_registered_before_a_crash_may_have_been_sent_so_it_is_compensated(operator: Operator) -> None:
    steps = [{"name": "create", "action": {"function": "gone"}, "compensation": {"function": "undo", "args": {"n": 1}}}]
    saga = operator.saga("o", steps=steps)
    # An earlier operator registered the step and may have sent it before it died; the function is gone now.
    operator.entry(saga, 1, effect="Pending", step="create", compensation={"function": "undo", "args": {"n": 1}})
    done = await operator.drive("o")
    assert done.status.phase == "Compensated"
    assert operator.state("o-1") == ("Failed", "Compensated")
    assert operator.undone() == [1]


async def test_an_answer_that_is_not_kept_as_output_says_why(operator: Operator) -> None:
    operator.webhook("create")
    omitted = OmittedOutput(reason=OutputOmission.ANSWER_NOT_JSON, message="not a JSON object (text/html, 9 bytes)")
    operator.transport.script("/create", CallOutcome(status_code=200, omitted=omitted))
    steps = [{"name": "create", "action": {"function": "create"}, "compensation": {"function": "undo"}}]
    operator.saga("o", steps=steps)
    done = await operator.drive("o")
    assert done.status.phase == "Completed"
    status = operator.kube.body("undoentries", NS, "o-1")["status"]
    assert "output" not in status
    assert status["outputOmitted"]["reason"] == "AnswerNotJson"


async def test_a_step_the_api_refuses_to_register_fails_the_saga_instead_of_retrying(operator: Operator) -> None:
    operator.webhook("create")
    operator.kube.refuse[("create", "undoentries")] = errors.Invalid("spec.saga: Too long", status=422)
    steps = [{"name": "create", "action": {"function": "create"}, "compensation": {"function": "undo"}}]
    operator.saga("o", steps=steps)
    done = await operator.drive("o")
    assert (done.status.phase, done.status.reason) == ("Compensated", "Compensated")
    succeeded = next(c for c in done.status.conditions if c.type == "Succeeded")
    assert succeeded.reason == "StepNotRegistered"
    assert "spec.saga: Too long" in succeeded.message
    assert operator.transport.sent == []


async def test_an_entry_registered_after_completion_is_settled_and_said(operator: Operator) -> None:
    saga = operator.saga("c", outcome="Commit")
    operator.entry(saga, 1)
    done = await operator.drive("c")
    assert (done.status.phase, done.status.top_position) == ("Completed", 1)
    operator.entry(saga, 2)
    await operator.drive("c")
    late = operator.kube.body("undoentries", NS, "c-2")["status"]
    assert (late["state"], late["reason"]) == ("Skipped", "RegisteredAfterCompletion")
    assert operator.state("c-1") == ("Committed", "Pending")  # the committed step is left alone
    assert any(reason == "EntryAfterCompletion" for _, reason, _ in operator.kube.events)
    assert operator.transport.sent == []


async def test_a_quick_orchestrated_saga_costs_two_writes_a_step_and_two_of_its_own(operator: Operator) -> None:
    """Its steps run before Active is written: Completed is its first status, and no Event is
    posted for a start nobody could have watched. Kept (no TTL), it costs no write for its entries'
    field owners: each outcome, written with the object, dropped them."""
    created = fresh_orchestrated(operator, "o", ["work", "work", "work"])
    operator.kube.requests.clear()
    done = await operator.drive("o")
    assert done.status.phase == "Completed"
    writes = [r for r in operator.kube.requests if r[0] in ("create", "patch", "patch-status")]
    per_step = [("create", "undoentries"), ("patch", "undoentries")]
    assert writes == [("patch", "sagas"), *per_step * 3, ("patch-status", "sagas"), ("patch", "sagas")]
    assert done.status.start_time == Saga.model_validate(created).metadata.creation_timestamp
    assert (done.status.stack_depth, done.status.completion_time is not None) == (3, True)
    assert FINALIZER not in done.metadata.finalizers
    assert [reason for _, reason, _ in operator.kube.events if reason == SagaPhase.ACTIVE] == []


async def test_a_step_that_outlasts_the_moment_shows_its_saga_active_meanwhile(
    operator: Operator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(phases, "ACTIVE_WRITE_AFTER", timedelta(seconds=0.3))
    fresh_orchestrated(operator, "o", ["slow", "work"])

    async def slow(call: PreparedCall) -> None:
        if call.target.url.endswith("/slow"):  # the call is held until the saga shows Active
            phase = await eventually(
                lambda: asyncio.sleep(0, operator.kube.body("sagas", NS, "o").get("status", {}).get("phase")),
                lambda phase: phase == "Active",
                5,
                "Active written while the first step's call is in flight",
            )
            assert phase == "Active"

    operator.transport.on_send = slow
    done = await operator.drive("o")
    assert done.status.phase == "Completed"
    assert operator.transport.paths() == ["/slow", "/work"]
    assert SagaPhase.ACTIVE in [reason for _, reason, _ in operator.kube.events]


@pytest.mark.parametrize(
    "args",
    [
        {"copies": ["${steps.create.output}"] * 100},  # one output, a hundred times
        {"text": "${steps.create.output.blob}" * 100},  # spliced into one string
    ],
    ids=["values", "text"],
)
async def test_arguments_that_resolve_past_the_bound_are_refused_and_nothing_is_sent(
    operator: Operator, args: dict[str, Any]
) -> None:
    """A saga of a few KiB whose references multiply a 16 KiB output: 1.6 MB to send here, and
    with 50,000 of them (the API takes that much) gigabytes held by the operator, which its
    memory limit ends, at every restart. Refused like a reference that cannot be resolved."""
    operator.webhook("create")
    operator.webhook("grant")
    blob = "x" * 15_000
    operator.transport.script("/create", CallOutcome(status_code=200, output={"blob": blob}))
    steps = [
        {"name": "create", "action": {"function": "create"}, "compensation": {"function": "undo", "args": {"n": 1}}},
        {"name": "grant", "action": {"function": "grant", "args": args}, "compensation": {"function": "undo"}},
    ]
    operator.saga("o", steps=steps)
    done = await operator.drive("o")
    assert (done.status.phase, done.status.failed_step) == ("Compensated", "grant")
    assert operator.transport.paths() == ["/create", "/undo"]
    never = operator.kube.body("undoentries", NS, "o-2")["status"]
    assert (never["effect"], never["state"]) == ("NotSent", "Skipped")
    assert "resolved, come to more than 1048576 bytes" in never["skipReason"]
    assert ("o", "ArgumentsTooLarge") in [(name, reason) for name, reason, _ in operator.kube.events]


async def test_an_effect_that_cannot_be_sent_says_why_within_the_fields_bound(operator: Operator) -> None:
    """Why an effect cannot be sent quotes the reference that failed, which an author can make as
    long as the API takes: past lastError's bound the status could not even be built (pydantic's
    ValidationError), so the saga kept failing in the operator instead of recording the effect."""
    operator.webhook("create")
    operator.webhook("mail")
    operator.transport.script("/create", CallOutcome(status_code=200, output={"id": 1}))
    path = "a" * 5000
    steps = [{"name": "create", "action": {"function": "create"}, "compensation": {"function": "undo"}}]
    effects = [{"name": "thanks", "call": {"function": "mail", "args": {"x": f"${{steps.create.output.{path}}}"}}}]
    operator.saga("o", steps=steps, effects=effects)
    done = await operator.drive("o")
    assert done.status.phase == "Completed"
    (effect,) = done.status.effects
    assert effect.state == "Failed"
    assert effect.last_error is not None
    assert effect.last_error.startswith("UnresolvedReference: ${steps.create.output.aaa")
    assert operator.transport.paths() == ["/create"]
