"""The entry index: the newest copy wins, deletions stick, a listing replaces what it held."""

from __future__ import annotations

from tests.support.objects import entry
from undolog.controller.entry_index import EntryIndex


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
    assert sorted(e.metadata.name for e in index.held("ns")) == ["s-2", "t-1"]
