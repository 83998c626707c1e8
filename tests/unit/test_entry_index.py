"""The entry index: the newest copy wins, deletions stick, a listing replaces what it held."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tests.support.objects import entry
from undolog.api import Attempt, AttemptKind, EffectState, EntryState
from undolog.controller.entry_index import HOT_SAGAS, EntryIndex


def test_newest_copy_wins_whatever_the_arrival_order() -> None:
    index = EntryIndex()
    index.keep(entry("s", 1, rv=10, state="Compensated"))
    index.keep(entry("s", 1, rv=7, state="Running"))  # a late event of an older version
    assert index.of(("ns", "s"))["s-1"].status.state == "Compensated"


def test_a_deleted_entry_is_not_brought_back_by_an_older_copy() -> None:
    index = EntryIndex()
    index.keep(entry("s", 1, rv=5))
    index.deleted(entry("s", 1, rv=9))
    index.keep(entry("s", 1, rv=5))  # a driver's stale copy
    assert index.of(("ns", "s")) == {}
    index.keep(entry("s", 1, rv=12))  # created again afterwards
    assert list(index.of(("ns", "s"))) == ["s-1"]


def test_a_listing_replaces_what_the_index_held_for_the_saga() -> None:
    index = EntryIndex()
    index.keep(entry("s", 1, rv=5))
    index.keep(entry("s", 2, rv=6))
    index.keep(entry("t", 1, rv=6))
    gone = index.replace(("ns", "s"), [entry("s", 2, rv=8)])
    assert list(index.of(("ns", "s"))) == ["s-2"]
    assert [e.metadata.name for e in gone] == ["s-1"]  # deleted: the driver reports it
    assert list(index.of(("ns", "t"))) == ["t-1"]  # another saga's entries are untouched
    assert [e.metadata.name for e in index.absent("ns", {("ns", "t-1")})] == ["s-2"]
    assert sorted(index.sagas()) == [("ns", "s"), ("ns", "t")]


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=10,
)


@given(
    state=st.sampled_from(list(EntryState)),
    effect=st.sampled_from(list(EffectState)),
    error=st.none() | st.text(max_size=200),
    output=st.none() | st.dictionaries(st.text(max_size=8), json_values, max_size=4),
    moment=st.datetimes(timezones=st.just(UTC)),
    annotations=st.dictionaries(st.text("abc./", min_size=1, max_size=10), st.text(max_size=30), max_size=3),
    attempts=st.integers(0, 3),
)
def test_an_entry_is_given_back_as_it_was_kept(
    state: EntryState,
    effect: EffectState,
    error: str | None,
    output: dict[str, Any] | None,
    moment: datetime,
    annotations: dict[str, str],
    attempts: int,
) -> None:
    """The index holds entries as JSON (memory): what it gives back equals what it was given."""
    kept = entry("s", 1, rv=3)
    status = kept.status.model_copy(
        update={
            "state": state,
            "effect": effect,
            "last_error": error,
            "output": output,
            "executed_at": moment,
            "attempts": [
                Attempt(kind=AttemptKind.COMPENSATION, time=moment, number=n + 1, duration_milliseconds=n)
                for n in range(attempts)
            ],
        }
    )
    meta = kept.metadata.model_copy(update={"annotations": annotations, "deletion_timestamp": moment})
    kept = kept.model_copy(update={"status": status, "metadata": meta})
    index = EntryIndex()
    index.keep(kept)
    for other in range(HOT_SAGAS):  # the saga is then the one used longest ago: held as JSON
        index.keep(entry(f"t{other}", 1, rv=1))
    assert isinstance(index._by_saga[("ns", "s")]["s-1"], tuple)
    assert index.of(("ns", "s")) == {"s-1": kept}
