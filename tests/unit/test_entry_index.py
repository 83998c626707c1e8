"""The entry index: newest copy wins, deletions stick, completeness follows the watch."""

from __future__ import annotations

from typing import Any

from undolog.controller.entry_index import EntryIndex


def entry(name: str, rv: int, saga: str = "s", namespace: str = "ns", state: str = "Pending") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace, "resourceVersion": str(rv)},
        "spec": {"saga": saga},
        "status": {"state": state},
    }


def test_newest_copy_wins_whatever_the_arrival_order() -> None:
    index = EntryIndex()
    index.keep(entry("s-1", 10, state="Compensated"))
    index.keep(entry("s-1", 7, state="Running"))  # a late event of an older version
    assert index.of(("ns", "s"))["s-1"]["status"]["state"] == "Compensated"


def test_a_deleted_entry_is_not_brought_back_by_an_older_copy() -> None:
    index = EntryIndex()
    index.keep(entry("s-1", 5))
    index.watched(entry("s-1", 9), deleted=True)
    index.keep(entry("s-1", 5))  # a driver's stale copy
    assert index.of(("ns", "s")) == {}
    index.keep(entry("s-1", 12))  # created again afterwards
    assert list(index.of(("ns", "s"))) == ["s-1"]


def test_completeness_needs_the_listing_or_the_stream_past_the_version() -> None:
    everywhere = EntryIndex(clusterwide=True)
    assert not everywhere.complete_at("ns", "5")
    everywhere.prime([entry("s-1", 3)], "20", None)
    assert everywhere.complete_at("ns", "20")
    assert not everywhere.complete_at("ns", "21")
    everywhere.watched(entry("x-1", 30, namespace="other"), deleted=False)  # one stream: any event counts
    assert everywhere.complete_at("ns", "30")
    per_namespace = EntryIndex(clusterwide=False)
    per_namespace.watched(entry("x-1", 30, namespace="other"), deleted=False)
    assert not per_namespace.complete_at("ns", "30")
    assert not per_namespace.complete_at("ns", "not-a-number")


def test_a_listing_replaces_what_the_index_held_for_the_saga() -> None:
    index = EntryIndex()
    index.keep(entry("s-1", 5))
    index.keep(entry("s-2", 6))
    gone = index.replace(("ns", "s"), [entry("s-2", 8)])
    assert list(index.of(("ns", "s"))) == ["s-2"]
    assert [body["metadata"]["name"] for body in gone] == ["s-1"]  # deleted: the driver reports it
