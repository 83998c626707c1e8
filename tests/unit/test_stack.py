"""The Stack answers what a walk over its entries would, whatever was put, replaced or popped
before, in whatever order (its heaps and counters are kept as entries change)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from undolog.api import EntryState, UndoEntry
from undolog.conventions import SKIP_ANNOTATION
from undolog.decisions import compensation_plan, rewind
from undolog.decisions.stack import Stack

from .test_phases import make_entry, with_state

STATES = [s.value for s in EntryState]
ASKED = [compensation_plan.OWED, compensation_plan.UNSETTLED, compensation_plan.FAILED, compensation_plan.SETTLED]

# One change: (position, state, annotated, output) put; or (position, None, ...) popped.
changes = st.lists(
    st.tuples(st.integers(1, 12), st.sampled_from([*STATES, None]), st.booleans(), st.sampled_from([None, {"n": 1}])),
    max_size=60,
)


def changed(position: int, state: str, annotated: bool, output: dict[str, Any] | None) -> UndoEntry:
    entry = with_state(make_entry(position), state)
    entry.metadata.annotations.update({SKIP_ANNOTATION: "by hand"} if annotated else {})
    entry.status.output = output
    return entry


def walked(entries: list[UndoEntry], states: frozenset[EntryState]) -> UndoEntry | None:
    among = [e for e in entries if e.status.state in states]
    return max(among, key=lambda e: e.spec.stack_position) if among else None


@given(changes, st.integers(0, 60))
def test_the_stack_answers_as_a_walk_over_its_entries(steps: list[tuple[Any, ...]], ask_from: int) -> None:
    stack, held = Stack(), dict[str, UndoEntry]()
    for number, (position, state, annotated, output) in enumerate(steps):
        name = f"s-{position}"
        if state is None:
            stack.pop(name)
            held.pop(name, None)
        else:
            stack.put(entry := changed(position, state, annotated, output))
            held[name] = entry
        if number < ask_from:
            continue  # the heaps are made on the first question, and kept from then on
        entries = list(held.values())
        for states in ASKED:
            assert stack.highest(states) == walked(entries, states)
            assert stack.count(states) == sum(1 for e in entries if e.status.state in states)
        assert {e.metadata.name for e in stack.annotated()} == {
            e.metadata.name for e in entries if SKIP_ANNOTATION in e.metadata.annotations
        }
        assert stack.outputs() == rewind.outputs(entries)
    assert sorted(e.metadata.name for e in stack) == sorted(held)


def test_what_changed_is_handed_over_once_and_a_listing_replaces_the_rest() -> None:
    first, second, third = make_entry(1), make_entry(2), make_entry(3)
    stack = Stack([first, second])
    assert stack.taken_changed() == []  # what it was made from is not a change
    stack.put(with_state(second, "Compensated"))
    assert [e.status.state for e in stack.taken_changed()] == [EntryState.COMPENSATED]
    assert stack.taken_changed() == []
    stack.replace([second, third])
    assert sorted(e.metadata.name for e in stack) == ["s-2", "s-3"]
    assert stack.highest(compensation_plan.OWED) == third
    assert {e.metadata.name for e in stack.taken_changed()} == {"s-2", "s-3"}  # s-1 is gone, not handed over


def test_the_stack_is_a_collection_of_the_entries_it_holds() -> None:
    first = make_entry(1)
    stack = Stack([first])
    assert first in stack
    assert with_state(first, "Compensated") not in stack  # another copy than the one held
    assert make_entry(2) not in stack
