"""The entry watch: events applied to the index in the stream's order, each resumed where the
last ended; an expired revision lists again and reports what vanished meanwhile; an entry the
API took but UndoLog cannot read is delivered as such, never dropped. The Kubernetes adapter
is replaced by a scripted one (what reaches the index and the engine, in what order)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from tests.support.objects import entry_body
from undolog import errors
from undolog.api import UndoEntry
from undolog.api.common import revision_of
from undolog.controller.entry_index import EntryIndex
from undolog.controller.entry_watch import EntryEvent, EntryWatch
from undolog.kube import Body
from undolog.ledger import Unreadable


def body(position: int, rv: int) -> Body:
    return entry_body("s", position, rv=rv)


@dataclass
class ScriptedKube:
    listings: list[tuple[list[Body], str]]
    streams: list[list[tuple[str, Body]] | errors.KubeError]
    watched_from: list[str] = field(default_factory=list)
    idle: asyncio.Event = field(default_factory=asyncio.Event)  # every scripted stream was read

    async def list_pages(
        self, plural: str, namespace: str | None, label_selector: str | None = None
    ) -> AsyncIterator[tuple[list[Body], str]]:
        items, version = self.listings.pop(0)
        for at in range(0, max(len(items), 1), 2):  # two to a page
            yield items[at : at + 2], version

    async def watch(
        self, plural: str, namespace: str | None, version: str, label_selector: str | None = None
    ) -> AsyncIterator[tuple[str, Body]]:
        self.watched_from.append(version)
        if not self.streams:
            self.idle.set()
            await asyncio.Event().wait()  # an open stream with nothing new
        step = self.streams.pop(0)
        if isinstance(step, errors.KubeError):
            raise step
        for event in step:
            yield event


async def follow(
    kube: ScriptedKube, index: EntryIndex, parsed: list[int | None] | None = None
) -> list[tuple[str, str]]:
    """What the watch delivered once it has read every scripted stream; `parsed`: the revision
    of each event it parsed."""
    delivered: list[tuple[str, str]] = []

    def deliver(event: EntryEvent) -> None:
        if isinstance(event, Unreadable):
            delivered.append(("UNREADABLE", event.lost.name))
        else:
            delivered.append(("DELETED" if event[1] else "CHANGED", event[0].metadata.name))

    watch = EntryWatch(kube, index, deliver, None)  # type: ignore[arg-type]
    if parsed is not None:
        parse = watch.stream.parse

        def counted(body: Body) -> UndoEntry | Unreadable:
            parsed.append(revision_of(body["metadata"]["resourceVersion"]))
            return parse(body)

        watch.stream.parse = counted
    await watch.sync()
    delivered.clear()  # the first listing is delivered by the engine itself
    task = asyncio.create_task(watch.run())
    try:
        # Once it opens the stream after the scripted ones, every scripted event was applied.
        await asyncio.wait_for(kube.idle.wait(), timeout=5)
    finally:
        task.cancel()
    return delivered


async def test_events_are_applied_in_order_and_each_stream_resumes_where_the_last_ended() -> None:
    index = EntryIndex()
    kube = ScriptedKube(
        listings=[([body(1, 5)], "10")],
        streams=[
            [("ADDED", body(2, 11)), ("ADDED", body(3, 12))],  # the apiserver closes it
            [("BOOKMARK", {"metadata": {"resourceVersion": "40"}})],
            errors.Unavailable("connection reset"),  # an outage: watched again from the same place
        ],
    )
    delivered = await follow(kube, index)
    assert delivered == [("CHANGED", "s-2"), ("CHANGED", "s-3")]
    assert kube.watched_from == ["10", "12", "40", "40"]
    assert sorted(index.of(("ns", "s"))) == ["s-1", "s-2", "s-3"]


async def test_an_expired_revision_lists_again_and_reports_what_vanished() -> None:
    index = EntryIndex()
    kube = ScriptedKube(
        listings=[([body(1, 5), body(2, 6)], "10"), ([body(2, 30), body(3, 31)], "50")],
        streams=[errors.Gone("too old", status=410), [("MODIFIED", body(3, 51))]],
    )
    delivered = await follow(kube, index)
    # The listing replayed page by page; s-1, deleted while no stream was open, then reported as such.
    assert delivered == [("CHANGED", "s-2"), ("CHANGED", "s-3"), ("DELETED", "s-1"), ("CHANGED", "s-3")]
    assert kube.watched_from == ["10", "50", "51"]
    assert sorted(index.of(("ns", "s"))) == ["s-2", "s-3"]
    assert index.of(("ns", "s"))["s-3"].metadata.resource_version == "51"


async def test_an_unreadable_entry_is_delivered_as_such() -> None:
    broken = body(2, 11)
    broken["spec"]["undoId"] = "not-a-uuid"
    index = EntryIndex()
    kube = ScriptedKube(listings=[([], "10")], streams=[[("ADDED", broken), ("ADDED", body(3, 12))]])
    delivered = await follow(kube, index)
    assert delivered == [("UNREADABLE", "s-2"), ("CHANGED", "s-3")]
    assert sorted(index.of(("ns", "s"))) == ["s-3"]


async def test_progress_reaches_a_revision_only_once_everything_up_to_it_was_applied() -> None:
    index = EntryIndex()
    kube = ScriptedKube(
        listings=[([body(1, 5)], "10")],
        streams=[[("ADDED", body(2, 11)), ("BOOKMARK", {"metadata": {"resourceVersion": "40"}})]],
    )
    watch = EntryWatch(kube, index, lambda event: None, None)  # type: ignore[arg-type]
    at_delivery: list[tuple[int, int]] = []  # (progress, held entries) as each event is handed over
    watch.deliver = lambda event: at_delivery.append((watch.progress.revision, len(index.of(("ns", "s")))))
    await watch.sync()
    assert watch.progress.revision == 10
    waiting = [asyncio.create_task(watch.progress.reached(r, within=5)) for r in (11, 40)]
    task = asyncio.create_task(watch.run())
    try:
        assert await asyncio.gather(*waiting) == [True, True]
        assert at_delivery[-1] == (10, 2)  # s-2 was in the index before the progress passed it
        assert watch.progress.revision == 40
        assert not await watch.progress.reached(41, within=0.01)  # nothing more came
        assert watch.progress._waiting == []  # a waiter that gave up is not kept
    finally:
        task.cancel()


async def test_the_echo_of_a_copy_the_index_holds_is_neither_parsed_nor_delivered() -> None:
    """A driver keeps what its write was answered in the index; the watch's echo of that same
    copy woke the driver for a reconcile that decided nothing (a third of the entry events with
    sagas compensating). A newer copy, or a deletion, is delivered as ever, and the progress
    passes the echo all the same (the proofs wait on it)."""
    index = EntryIndex()
    written = UndoEntry.model_validate(body(2, 11))
    index.keep(written)  # the driver's write as the API answered it, made as the watch lists
    kube = ScriptedKube(
        listings=[([body(1, 5), body(2, 6)], "10")],
        streams=[[("MODIFIED", body(2, 11)), ("MODIFIED", body(2, 12)), ("DELETED", body(1, 13))]],
    )
    parsed: list[int | None] = []
    assert await follow(kube, index, parsed) == [("CHANGED", "s-2"), ("DELETED", "s-1")]
    assert parsed == [5, 6, 12, 13]  # the listing's, then the events' but the echo's
    assert index.of(("ns", "s"))["s-2"].metadata.revision == 12
    assert "s-1" not in index.of(("ns", "s"))
