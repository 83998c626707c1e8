"""The entry watch: events applied in the stream's order, bookmarks count as progress, an
expired revision lists again and reports what vanished meanwhile. The Kube adapter is
replaced by a scripted one (pure logic: what reaches the index and the engine, in what order)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from undolog.controller.entry_index import EntryIndex
from undolog.controller.entry_watch import EntryWatch
from undolog.kube import ApiException, Body


def entry(name: str, rv: int, saga: str = "s") -> Body:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": str(rv)}, "spec": {"saga": saga}}


@dataclass
class ScriptedKube:
    listings: list[tuple[list[Body], str]]
    streams: list[list[tuple[str, Body]] | ApiException]
    watched_from: list[str] = field(default_factory=list)
    idle: asyncio.Event = field(default_factory=asyncio.Event)  # every scripted stream was read

    async def list_versioned(self, plural: str, namespace: str | None) -> tuple[list[Body], str]:
        return self.listings.pop(0)

    async def watch(self, plural: str, namespace: str | None, version: str) -> AsyncIterator[tuple[str, Body]]:
        self.watched_from.append(version)
        if not self.streams:
            self.idle.set()
            await asyncio.Event().wait()  # an open stream with nothing new
        step = self.streams.pop(0)
        if isinstance(step, ApiException):
            raise step
        for event in step:
            yield event


async def follow(kube: ScriptedKube, index: EntryIndex) -> list[tuple[str, str]]:
    delivered: list[tuple[str, str]] = []

    def deliver(kind: str, body: Body) -> None:
        index.watched(body, deleted=kind == "DELETED")
        delivered.append((kind, body["metadata"]["name"]))

    watch = EntryWatch(kube, index, deliver, None)  # type: ignore[arg-type]
    await watch.sync()
    task = asyncio.create_task(watch.run())
    try:
        # Once it opens the stream after the scripted ones, every scripted event was applied.
        await asyncio.wait_for(kube.idle.wait(), timeout=5)
    finally:
        task.cancel()
    return delivered


async def test_events_are_applied_in_order_and_bookmarks_advance_completeness() -> None:
    index = EntryIndex()
    kube = ScriptedKube(
        listings=[([entry("s-1", 5)], "10")],
        streams=[
            [("ADDED", entry("s-2", 11)), ("ADDED", entry("s-3", 12))],  # the apiserver closes it
            [("BOOKMARK", {"metadata": {"resourceVersion": "40"}})],
        ],
    )
    delivered = await follow(kube, index)
    assert delivered == [("ADDED", "s-2"), ("ADDED", "s-3")]
    assert kube.watched_from == ["10", "12", "40"]  # each stream resumes where the last one ended
    assert sorted(index.of(("ns", "s"))) == ["s-1", "s-2", "s-3"]
    assert index.complete_at("ns", "40")
    assert not index.complete_at("ns", "41")


async def test_an_expired_revision_lists_again_and_reports_what_vanished() -> None:
    index = EntryIndex()
    kube = ScriptedKube(
        listings=[([entry("s-1", 5), entry("s-2", 6)], "10"), ([entry("s-2", 30), entry("s-3", 31)], "50")],
        streams=[ApiException(status=410, reason="Expired"), [("MODIFIED", entry("s-3", 51))]],
    )
    delivered = await follow(kube, index)
    # s-1 was deleted while no stream was open: reported as a deletion, then the listing replayed.
    assert delivered == [("DELETED", "s-1"), ("MODIFIED", "s-2"), ("MODIFIED", "s-3"), ("MODIFIED", "s-3")]
    assert kube.watched_from == ["10", "50", "51"]
    assert sorted(index.of(("ns", "s"))) == ["s-2", "s-3"]
    assert index.of(("ns", "s"))["s-3"]["metadata"]["resourceVersion"] == "51"
