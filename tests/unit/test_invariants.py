"""The fault-injection invariant checker finds what it must (and nothing else)."""

from __future__ import annotations

from typing import Any

from tests.chaos.invariants import Call, check


def saga(name: str, phase: str, reason: str = "Compensated", **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": name, "uid": f"uid-{name}"},
        "status": {"phase": phase, "reason": reason, **status},
    }


def entry(
    saga_name: str, position: int, state: str = "Compensated", effect: str = "Committed", owner: str | None = None
) -> dict[str, Any]:
    owner_reference = {"kind": "Saga", "name": owner or saga_name, "uid": f"uid-{owner or saga_name}"}
    return {
        "metadata": {"namespace": "ns", "name": f"{saga_name}-{position}", "ownerReferences": [owner_reference]},
        "spec": {
            "saga": saga_name,
            "stackPosition": position,
            "undoId": f"{saga_name}{position}",
            "step": f"s{position}",
            "compensation": {"function": "undo"},
        },
        "status": {"state": state, "effect": effect},
    }


def undo(saga_name: str, position: int, at: float, replied: int = 200) -> Call:
    return Call(key=f"undo-{saga_name}{position}", saga=f"ns/{saga_name}", step=f"s{position}", at=at, replied=replied)


def test_a_clean_lifo_run_passes() -> None:
    report = check(
        [saga("a", "Compensated")],
        [entry("a", 1), entry("a", 2), entry("a", 3)],
        [],
        [undo("a", 3, 1.0, 503), undo("a", 3, 1.1), undo("a", 3, 1.2), undo("a", 2, 1.3), undo("a", 1, 1.4)],
    )
    assert report.violations == []
    assert (report.effects_checked, report.compensations_checked) == (3, 3)


def test_out_of_order_compensation_is_caught() -> None:
    report = check(
        [saga("a", "Compensated")],
        [entry("a", 1), entry("a", 2)],
        [],
        [undo("a", 2, 1.0, 503), undo("a", 1, 1.1), undo("a", 2, 1.2)],
    )
    assert report.violations == ["ns/a: a-1 was compensated before a-2 had succeeded (order broken)"]


def test_the_dependency_order_is_checked_instead_of_lifo_where_declared() -> None:
    diamond = [entry("d", 1), entry("d", 2), entry("d", 3), entry("d", 4)]
    diamond[1]["spec"]["dependsOn"] = ["s1"]
    diamond[2]["spec"]["dependsOn"] = ["s1"]
    diamond[3]["spec"]["dependsOn"] = ["s2", "s3"]
    together = [undo("d", 4, 1.0), undo("d", 2, 1.1), undo("d", 3, 1.1), undo("d", 1, 1.3)]
    assert check([saga("d", "Compensated")], diamond, [], together).violations == []
    early = [undo("d", 4, 1.0), undo("d", 2, 1.1), undo("d", 1, 1.2), undo("d", 3, 1.3)]
    assert check([saga("d", "Compensated")], diamond, [], early).violations == [
        "ns/d: d-1 was compensated before d-3 had succeeded (order broken)"
    ]
    skipped_the_top = [undo("d", 2, 1.0), undo("d", 3, 1.0), undo("d", 4, 1.1), undo("d", 1, 1.3)]
    assert check([saga("d", "Compensated")], diamond, [], skipped_the_top).violations == [
        "ns/d: d-3 was compensated before d-4 had succeeded (order broken)",
        "ns/d: d-2 was compensated before d-4 had succeeded (order broken)",
    ]


def test_unfinished_sagas_missed_compensations_and_stray_keys_are_caught() -> None:
    report = check(
        [
            saga("a", "Compensating"),
            saga("b", "Compensated"),
            saga("c", "Completed", "Committed"),
            saga("d", "Halted", ""),
        ],
        [entry("b", 1, state="Pending"), entry("c", 1, state="Pending")],
        [
            Call(key="k1", saga="ns/b", step="s1", at=0.1, replied=200),
            Call(key="k2", saga="ns/b", step="s1", at=0.2, replied=200),
        ],
        [undo("c", 1, 1.0), Call(key="undo-ghost", saga="ns/x", step="s9", at=2.0, replied=200)],
    )
    text = "\n".join(report.violations)
    assert "ns/a ended Compensating" in text
    assert "ns/d ended Halted" in text  # halted without a reason
    assert "ns/b: b-1 is Pending in a Compensated saga" in text
    assert "ns/c: entry c-1 of a Completed saga was compensated" in text
    assert "ns/b step s1 was sent under 2 keys" in text
    assert "compensation under unknown key undo-ghost" in text


def test_halted_with_a_reason_is_an_accepted_end() -> None:
    report = check(
        [saga("h", "Halted", "CompensationFailed")], [entry("h", 1, state="Failed")], [], [undo("h", 1, 1.0, 400)]
    )
    assert report.violations == []


def test_an_entry_a_saga_does_not_own_must_be_left_alone_said_and_named() -> None:
    foreign = entry("a", 2, state="Pending", owner="b")
    foreign["status"]["reason"] = "NotOwnedBySaga"
    clean = check([saga("a", "Compensated", unownedEntries=["a-2"])], [entry("a", 1), foreign], [], [undo("a", 1, 1.0)])
    assert clean.violations == []
    compensated = {**foreign, "status": {"state": "Compensated", "effect": "Committed"}}
    found = check([saga("a", "Compensated")], [entry("a", 1), compensated], [], [undo("a", 2, 0.5), undo("a", 1, 1.0)])
    assert found.violations == [
        "ns/a: a-2, not its own, is Compensated with reason None",
        "ns/a: a-2, not its own, is not named in status.unownedEntries",
        "compensation under unknown key undo-a2 (1 calls)",
    ]
