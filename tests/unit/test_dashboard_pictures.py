"""The dashboard's pictures and overview as data: calls placed on the time axis where and as long
as they happened, failures, retries, halts and waves marked; the dependency graph's columns and
direct edges; the overview's counts; the base path refused unless it is a path."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from tests.unit.test_phases import NOW, make_entry, make_saga
from undolog.api import Saga, SagaPhase, UndoEntry
from undolog.dashboard import pictures
from undolog.dashboard.overview import NO_FUNCTION, overview_of
from undolog.dashboard.server import base_path
from undolog.kube.events import EventRecord


def called(entry: UndoEntry, *attempts: tuple[str, float, int, int | None, str | None]) -> UndoEntry:
    """The entry with these calls: (kind, seconds after NOW, number, HTTP status, error), 100 ms each."""
    recorded: list[dict[str, Any]] = [
        {
            "kind": kind,
            "time": (NOW + timedelta(seconds=at)).isoformat(),
            "number": number,
            "statusCode": status,
            "error": error,
            "durationMilliseconds": 100,
        }
        for kind, at, number, status, error in attempts
    ]
    body = entry.to_api()
    body["status"]["attempts"] = recorded
    return UndoEntry.model_validate(body)


def event(at: float, reason: str, kind: str = "Warning") -> EventRecord:
    return EventRecord(NOW + timedelta(seconds=at), kind, reason, f"{reason} happened", "s")


def test_calls_are_drawn_where_and_as_long_as_they_happened_newest_entry_on_top() -> None:
    newest = called(make_entry(2), ("Forward", 1.0, 1, 200, None), ("Compensation", 3.0, 1, 200, None))
    oldest = called(make_entry(1), ("Forward", 0.0, 1, 200, None), ("Compensation", 9.0, 1, 200, None))
    drawn = pictures.timeline([newest, oldest], [], NOW)
    assert drawn is not None
    assert [name for _, name in drawn.lanes] == ["#2 step2", "#1 step1"]
    by_label = {bar.label.split(":")[0] + " " + bar.kind: bar for bar in drawn.bars}
    first, undo_newest = by_label["#1 step1 forward"], by_label["#2 step2 compensation"]
    assert first.x == pictures.LABELS  # the axis' zero
    assert by_label["#1 step1 compensation"].x + by_label["#1 step1 compensation"].width == pytest.approx(
        pictures.LABELS + pictures.PLOT
    )  # the last call ends the axis
    assert undo_newest.x == pytest.approx(pictures.LABELS + pictures.PLOT * 3.0 / 9.1)
    assert undo_newest.width == pytest.approx(pictures.PLOT * 0.1 / 9.1)
    assert undo_newest.y == 0  # the newest entry's lane is the top one
    assert drawn.bands == []  # one compensation after the other: nothing ran together


def test_failed_calls_retries_and_halts_are_marked_and_said() -> None:
    entry = called(
        make_entry(1),
        ("Compensation", 1.0, 1, 404, "HTTP 404: no such user"),
        ("Compensation", 2.0, 2, None, "timed out after 5 s"),
    )
    drawn = pictures.timeline([entry], [event(0.5, "Failed"), event(2.2, "Halted")], NOW)
    assert drawn is not None
    assert [bar.kind for bar in drawn.bars] == ["compensation failed", "compensation failed retry"]
    assert "call 2 at +2.000 s, 100 ms, no answer: timed out after 5 s" in drawn.bars[1].label
    assert [(m.kind, m.label) for m in drawn.marks] == [
        ("warning", "Failed: Failed happened"),
        ("halt", "Halted: Halted happened"),
    ]


def test_compensations_of_several_entries_that_overlapped_are_one_band() -> None:
    entries = [
        called(make_entry(3), ("Compensation", 1.00, 1, 200, None)),
        called(make_entry(2), ("Compensation", 1.05, 1, 200, None)),
        called(make_entry(1), ("Compensation", 2.00, 1, 200, None)),
    ]
    drawn = pictures.timeline(entries, [], NOW)
    assert drawn is not None
    assert [band.label for band in drawn.bands] == ["ran together: #3, #2"]


def test_a_deep_stack_s_timeline_draws_its_newest_entries_and_says_how_many_are_not() -> None:
    entries = [called(make_entry(n), ("Compensation", 10_000 - n, 1, 200, None)) for n in range(1000, 0, -1)]
    drawn = pictures.timeline(entries, [], NOW)
    assert drawn is not None
    assert (len(drawn.lanes), drawn.omitted, drawn.lanes[0][1]) == (pictures.MAX_LANES, 900, "#1000 step1000")
    assert len(drawn.bars) == pictures.MAX_LANES


def test_a_saga_without_calls_has_no_timeline_and_ticks_are_round() -> None:
    assert pictures.timeline([make_entry(1)], [], NOW) is None
    assert [t.label for t in pictures.ticks(9.1)] == ["0", "+2 s", "+4 s", "+6 s", "+8 s"]
    assert [t.label for t in pictures.ticks(0.35)] == ["0", "+100 ms", "+200 ms", "+300 ms"]


def test_the_graph_draws_direct_dependencies_in_columns_by_chain_length() -> None:
    # 1 a; 2 b needs a; 3 c needs a and b (a through b: not drawn); 4 d needs a.
    entries = [
        make_entry(1),
        make_entry(2, depends_on=["step1"]),
        make_entry(3, depends_on=["step1", "step2"]),
        make_entry(4, depends_on=["step1"]),
    ]
    drawn = pictures.graph(entries)
    assert drawn is not None
    columns = {node.label: node.x for node in drawn.nodes}
    assert columns == {
        "#1 step1": 0,
        "#2 step2": pictures.COLUMN,
        "#3 step3": 2 * pictures.COLUMN,
        "#4 step4": pictures.COLUMN,
    }
    assert drawn.needs == {"#1 step1": [], "#2 step2": ["#1 step1"], "#3 step3": ["#2 step2"], "#4 step4": ["#1 step1"]}
    assert len(drawn.edges) == 3
    assert pictures.graph([make_entry(1), make_entry(2)]) is None  # strict LIFO: the stack says it all


def halted_saga(name: str, namespace: str) -> Saga:
    saga = make_saga("Halted")
    body = saga.to_api()
    body["metadata"] |= {"name": name, "namespace": namespace}
    return Saga.model_validate(body)


def test_the_overview_counts_phases_halts_by_function_and_the_hours_compensations() -> None:
    failed = make_entry(1, state="Failed").to_api()
    failed["metadata"] |= {"name": "h1-1", "namespace": "a"}
    failed["spec"] |= {"saga": "h1", "compensation": {"function": "delete-user"}}
    undone = [make_entry(n, state="Compensated").to_api() for n in (1, 2, 3)]
    for n, body in enumerate(undone):
        body["metadata"] |= {"namespace": "b", "name": f"x-{n}"}
        body["status"]["compensatedAt"] = (NOW - timedelta(minutes=[2, 7, 61][n])).isoformat()
    entries = [UndoEntry.model_validate(b) for b in [failed, *undone]]
    sagas = [halted_saga("h1", "a"), halted_saga("h2", "a"), make_saga("Active"), make_saga(None)]
    seen = overview_of(sagas, entries, NOW)
    assert dict(seen.phases)[SagaPhase.HALTED] == 2
    assert dict(seen.phases)[SagaPhase.ACTIVE] == 2  # one not taken up yet counts as Active
    assert seen.sagas == 4
    assert seen.halted == [("delete-user", "a", 1), (NO_FUNCTION, "a", 1)]
    assert [count for _, count in seen.compensated][-2:] == [1, 1]  # 7 and 2 minutes ago
    assert seen.compensated_in_the_hour == 2  # 61 minutes ago is not in the hour
    chart = pictures.columns(seen.compensated, NOW)
    assert chart.counts[0].name == "-60"
    assert chart.counts[-1].height == pictures.COLUMN_HEIGHT  # the largest step is the full height


@pytest.mark.parametrize(("given", "prefix"), [("", ""), ("/", ""), ("/undolog", "/undolog"), ("undolog/", "/undolog")])
def test_a_base_path_is_a_prefix_with_one_leading_slash(given: str, prefix: str) -> None:
    assert base_path(given) == prefix


@pytest.mark.parametrize("given", ["/a b", "/x?y", "/a/../b", "/<x>", "/%2e"])
def test_a_base_path_that_is_no_plain_path_is_refused(given: str) -> None:
    with pytest.raises(ValueError, match="--base-path"):
        base_path(given)
