"""Rewinds applied: the entries above undone, the saga handed back, refusals."""

from __future__ import annotations

from tests.unit.operator.harness import NS, Operator
from undolog.decisions.retry import CallOutcome


async def test_a_rewind_undoes_the_entries_above_and_hands_the_saga_back(operator: Operator) -> None:
    saga = operator.saga("r")
    for position in range(1, 6):
        operator.entry(saga, position)
    await operator.kube.patch("sagas", NS, "r", {"spec": {"rewind": {"toPosition": 2, "reason": "bad plan"}}})
    back = await operator.drive("r")
    assert (back.status.phase, back.status.reason) == ("Active", "Rewound")
    assert back.status.rewind is not None
    assert (back.status.rewind.state, back.status.rewind.undone) == ("Done", 3)
    assert operator.undone() == [5, 4, 3]
    for position in (3, 4, 5):
        assert operator.kube.body("undoentries", NS, f"r-{position}")["status"]["rewoundAt"]
    assert [operator.state(f"r-{p}")[1] for p in (1, 2)] == ["Pending", "Pending"]
    # The agent goes on (a new entry above), then commits; the same request is not carried out again.
    operator.entry(saga, 6)
    await operator.kube.patch("sagas", NS, "r", {"spec": {"outcome": "Commit"}})
    done = await operator.drive("r")
    assert done.status.phase == "Completed"
    assert operator.undone() == [5, 4, 3]
    phases_seen = [reason for _, reason, _ in operator.kube.events if reason in ("Rewinding", "Active")]
    assert phases_seen[-2:] == ["Rewinding", "Active"]


async def test_a_rewound_orchestrated_saga_runs_its_later_steps_again_with_new_keys(operator: Operator) -> None:
    for function in ("a", "b", "c"):
        operator.webhook(function)
    steps = [
        {"name": name, "action": {"function": name}, "compensation": {"function": "undo", "args": {"n": n}}}
        for n, name in enumerate(("a", "b", "c"), start=1)
    ]
    saga = operator.saga("o", steps=steps)
    for position, name in enumerate(("a", "b"), start=1):  # a and b ran; c has not yet
        operator.entry(saga, position, step=name, compensation={"function": "undo", "args": {"n": position}})
    await operator.kube.patch("sagas", NS, "o", {"spec": {"rewind": {"toPosition": 1, "reason": "redo b"}}})
    done = await operator.drive("o")
    assert done.status.phase == "Completed"
    assert operator.transport.paths() == ["/undo", "/b", "/c"]  # b undone, then b and c run
    uid = saga["metadata"]["uid"]
    keys = [call.headers["Idempotency-Key"] for call in operator.transport.sent[1:]]
    assert keys == [f"{uid}:b@3:fwd", f"{uid}:c:fwd"]  # b again: a new effect under a new key
    assert operator.kube.body("undoentries", NS, "o-2")["status"]["rewoundAt"]
    assert operator.state("o-3") == ("Committed", "Pending")


async def test_a_rewind_that_halts_resumes_rewinding_on_retry(operator: Operator) -> None:
    operator.transport.script("/undo", CallOutcome(status_code=400, output={"error": "no"}))
    saga = operator.saga("h")
    for position in (1, 2, 3):
        operator.entry(saga, position)
    await operator.kube.patch("sagas", NS, "h", {"spec": {"rewind": {"toPosition": 1, "reason": "r"}}})
    halted = await operator.drive("h")
    assert (halted.status.phase, halted.status.reason) == ("Halted", "CompensationFailed")
    await operator.kube.patch("sagas", NS, "h", {"metadata": {"annotations": {"undolog.io/retry": "fixed"}}})
    back = await operator.drive("h")
    assert (back.status.phase, back.status.reason) == ("Active", "Rewound")
    assert operator.undone() == [3, 3, 2]
    assert operator.state("h-1") == ("Committed", "Pending")


async def test_a_rewind_past_the_committed_pivot_is_refused(operator: Operator) -> None:
    for function in ("pay", "ship"):
        operator.webhook(function)
    steps = [
        {"name": "pay", "type": "Pivot", "action": {"function": "pay"}},
        {"name": "ship", "type": "Retriable", "action": {"function": "ship"}},
    ]
    saga = operator.saga("p", steps=steps)
    operator.entry(saga, 1, step="pay", compensation=None)
    await operator.kube.patch_status("sagas", NS, "p", {"status": {"pivotCommitted": True}})
    await operator.kube.patch("sagas", NS, "p", {"spec": {"rewind": {"toPosition": 0, "reason": "undo all"}}})
    done = await operator.drive("p")
    assert done.status.rewind is not None
    assert done.status.rewind.state == "Refused"
    assert "would undo the committed Pivot step 'pay' (position 1)" in (done.status.rewind.message or "")
    assert "/undo" not in operator.transport.paths()
