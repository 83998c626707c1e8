"""`undolog verify`'s rules: which runs to make and what each must show."""

from __future__ import annotations

from datetime import timedelta

from tests.unit.test_phases import NOW, make_entry, make_saga
from undolog.api import Attempt, AttemptKind, Step, UndoEntry
from undolog.decisions import verification


def steps(*types: str) -> list[Step]:
    return [
        Step.model_validate(
            {"name": f"step{i}", "type": t, "action": {"function": "do"}}
            | ({"compensation": {"function": f"undo{i}"}} if t == "Compensatable" else {})
        )
        for i, t in enumerate(types, start=1)
    ]


def test_a_failure_point_after_each_compensatable_step_and_in_each_compensation() -> None:
    points = verification.failure_points(steps("Compensatable", "Compensatable", "Pivot", "Retriable"))
    assert [p.label for p in points] == [
        "after step 1 (step1)",
        "after step 2 (step2)",
        "in the compensation of step1",
        "in the compensation of step2",
    ]
    assert [s.name for s in points[0].steps] == ["step1", verification.INJECTED_STEP]  # nothing after the Pivot
    broken = points[2].steps[0].compensation
    assert broken is not None
    assert broken.function == "undolog-verify-step1"
    assert points[3].steps[0].compensation == steps("Compensatable")[0].compensation  # only the one under test
    assert verification.failure_points(steps("Pivot", "Retriable")) == []


def undone(entry: UndoEntry, at: int) -> UndoEntry:
    moment = NOW + timedelta(seconds=at)
    attempt = Attempt(kind=AttemptKind.COMPENSATION, time=moment, number=1, status_code=200, duration_milliseconds=5)
    status = entry.status.model_copy(update={"state": "Compensated", "compensated_at": moment, "attempts": [attempt]})
    return entry.model_copy(update={"status": status})


def test_a_clean_run_has_no_gaps_and_out_of_order_or_leftovers_are_caught() -> None:
    point = verification.failure_points(steps("Compensatable", "Compensatable"))[1]
    done = make_saga("Compensated")
    clean = [undone(make_entry(1), 2), undone(make_entry(2), 1)]
    assert verification.gaps(point, done, clean) == []
    assert verification.undone_in_order(clean) == ["step2", "step1"]
    out_of_order = [undone(make_entry(1), 1), undone(make_entry(2), 2)]
    assert verification.gaps(point, done, out_of_order) == ["step1 was compensated before step2 was (order broken)"]
    left = [undone(make_entry(2), 1), make_entry(1, state="Failed")]
    assert verification.gaps(point, make_saga("Halted"), left) == [
        "ended Halted (None)",
        "step1 is Failed, not undone",
    ]
