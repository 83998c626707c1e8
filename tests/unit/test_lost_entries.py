"""How many lost entries a saga's status names, and which: within the API's bound, never
leaving out the entry the halt is decided on."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from undolog.api import MAX_LOST_ENTRIES, LostEntry, Saga
from undolog.decisions import lost_entries, phases


def lost(name: str, position: int | None, *, acknowledged: bool = False) -> LostEntry:
    return LostEntry(name=name, stack_position=position, why="deleted by hand", acknowledged=acknowledged)


@st.composite
def entries(draw: st.DrawFn) -> list[LostEntry]:
    """Lost entries, as many as the bound give or take (hypothesis alone keeps lists short)."""
    size = draw(st.integers(0, 2 * MAX_LOST_ENTRIES))
    positions = draw(st.lists(st.none() | st.integers(0, 400), min_size=size, max_size=size))
    acknowledged = draw(st.lists(st.booleans(), min_size=size, max_size=size))
    return [lost(f"s-{n}", p, acknowledged=a) for n, (p, a) in enumerate(zip(positions, acknowledged, strict=True))]


def halts_below(listed: list[LostEntry]) -> float | None:
    """What phases.compensate halts on: the highest unacknowledged lost entry (None: no halt)."""
    unacknowledged = [e.stack_position or 0 for e in listed if not e.acknowledged]
    return max(unacknowledged) if unacknowledged else None


@given(entries(), st.integers(0, 5), st.data())
def test_the_listed_entries_stay_within_the_bound_and_decide_the_halt_as_all_of_them_would(
    every: list[LostEntry], omitted: int, data: st.DataObject
) -> None:
    split = data.draw(st.integers(0, len(every)))
    earlier, omitted_earlier = lost_entries.recorded([], omitted, every[:split])
    listed, now_omitted = lost_entries.recorded(earlier, omitted_earlier, every[split:])
    assert len(listed) <= MAX_LOST_ENTRIES
    assert len(listed) + now_omitted == len(every) + omitted  # each one listed or counted
    assert halts_below(listed) == halts_below(every)
    order = [e.name for e in every]
    assert [e.name for e in listed] == sorted((e.name for e in listed), key=order.index)  # as they were lost


def test_an_entry_is_listed_once_as_first_reported() -> None:
    """The watch saw it deleted, then the write after its call found it gone: reported twice
    (seen when a namespace was deleted under a saga)."""
    first = lost("s-1", 1)
    in_flight = LostEntry(name="s-2", stack_position=2, why="deleted by hand while its call was in flight")
    new = [lost("s-2", 2), lost("s-1", 1), lost("s-3", 3), in_flight]
    listed, omitted = lost_entries.recorded([first], 0, new)
    assert ([(e.name, e.why) for e in listed], omitted) == (
        [("s-1", "deleted by hand"), ("s-2", "deleted by hand"), ("s-3", "deleted by hand")],
        0,
    )


def test_the_halt_message_names_ten_and_counts_the_rest() -> None:
    many = [lost(f"s-{n}", n) for n in range(120, 0, -1)]
    listed, omitted = lost_entries.recorded([], 0, many)
    saga = Saga.model_validate(
        {"metadata": {"name": "s", "namespace": "ns"}, "status": {"lostEntriesOmitted": omitted}}
    )
    message = phases.lost_message(saga, listed)
    assert message.startswith("cannot compensate s-120 (deleted by hand), s-119 (deleted by hand), ")
    assert ", s-111 (deleted by hand), and 90 more in status.lostEntries, and 20 more not listed" in message
    assert "their effects may remain. Undo them by hand" in message
    one = phases.lost_message(
        saga.model_copy(update={"status": saga.status.model_copy(update={"lost_entries_omitted": 0})}), listed[:1]
    )
    assert one.startswith("cannot compensate s-120 (deleted by hand): its effect may remain. Undo it by hand")
