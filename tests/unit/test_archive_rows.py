"""decisions/archive.py: when a finished saga's entries are the whole of it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from undolog.decisions.archive import missing, missing_in

positions = st.sets(st.integers(min_value=1, max_value=10_000), max_size=50)


@given(positions)
def test_every_entry_the_status_counts_is_whole_and_one_less_is_not(held: set[int]) -> None:
    assert missing(len(held), None, held) is None
    if held:
        fewer = held - {max(held)}
        assert missing(len(held), None, fewer) == f"{len(fewer)} entries where its status.stackDepth says {len(held)}"


@given(positions, st.sets(st.integers(min_value=10_001, max_value=20_000), max_size=5))
def test_entries_registered_after_a_commit_are_not_counted_against_its_depth(held: set[int], late: set[int]) -> None:
    top = max(held, default=0)
    assert missing(len(held), top, held | late) is None


def test_a_committed_saga_lacking_an_entry_below_its_top_is_not_whole_though_late_ones_make_up_the_count() -> None:
    assert missing(3, 3, [1, 2, 4]) == "2 entries at or below its top position 3 where its status.stackDepth says 3"


def test_two_entries_at_one_position_are_not_a_saga_s_stack() -> None:
    assert missing(2, None, [1, 1]) == "two entries at stack position 1"


def test_a_row_as_the_api_had_it() -> None:
    saga = {"status": {"stackDepth": 2, "phase": "Compensated"}}
    entries = [{"spec": {"stackPosition": 1}}, {"spec": {"stackPosition": 2}}]
    assert missing_in(saga, entries) is None
    assert missing_in(saga, entries[:1]) == "1 entries where its status.stackDepth says 2"
    assert missing_in({"status": {}}, []) is None  # a saga that registered no step
