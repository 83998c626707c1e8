"""UndoEntries as a shard's informer sees them: one ordered watch per watched namespace (or one
for all), of the shard's buckets, each event parsed once and applied to the index before the
informer hands it on. An entry labelled into the shard by hand that belongs to another is left
out (`owned`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from undolog.api import UndoEntry
from undolog.api.common import revision_in
from undolog.controller.entry_index import EntryIndex
from undolog.kube import Body, Kube
from undolog.kube.watch import OrderedWatch, Progress
from undolog.ledger import Unreadable, parse_entry

# (the entry, deleted?) for a readable entry; Unreadable for one the API took and UndoLog cannot use.
EntryEvent = tuple[UndoEntry, bool] | Unreadable


@dataclass
class EntryWatch:
    kube: Kube
    index: EntryIndex
    deliver: Callable[[EntryEvent], None]
    namespace: str | None  # None: all namespaces
    label_selector: str | None = None  # the shard's buckets (None: one shard, everything)
    owned: Callable[[UndoEntry], bool] = lambda _: True
    stream: OrderedWatch[UndoEntry | Unreadable] = field(init=False)

    def __post_init__(self) -> None:
        self.stream = OrderedWatch(
            self.kube,
            "undoentries",
            self.namespace,
            parse_entry,
            self._event,
            lambda _: None,
            label_selector=self.label_selector,
            relist=self.sync,
            news=self._news,
        )

    async def sync(self) -> list[Unreadable]:
        """List consistently and bring the index up to it, each page as it comes (30,000
        entries parsed at once were ~250 MiB). Entries held that the listing lacks were deleted
        while no stream was open: delivered as deletions (so a pending one is reported on its
        saga); the rest as changes, which wakes the sagas whose entries changed unseen. Returns
        the entries listed that cannot be read (delivered too)."""
        listed: set[tuple[str, str]] = set()
        unreadable: list[Unreadable] = []
        async for page in self.stream.pages():
            for parsed in page:
                if isinstance(parsed, Unreadable):
                    unreadable.append(parsed)
                    self.deliver(parsed)
                elif self.owned(parsed):
                    listed.add(parsed.key)
                    self.index.keep(parsed)
                    self.deliver((parsed, False))
        for entry in self.index.absent(self.namespace, listed):
            self.index.deleted(entry)
            self.deliver((entry, True))
        self.stream.progress.advance(self.stream.version)
        return unreadable

    async def run(self) -> None:
        await self.stream.run()

    @property
    def progress(self) -> Progress:
        return self.stream.progress

    def _news(self, kind: str, body: Body) -> bool:
        """Whether the event may tell anyone something: not the echo of a copy the index holds
        (a driver's own write, kept as it was answered), which woke its driver for nothing."""
        if kind == "DELETED":
            return True
        meta, spec = body["metadata"], body.get("spec")
        saga = spec.get("saga") if isinstance(spec, dict) else None
        if not isinstance(saga, str):
            return True
        return not self.index.holds(meta["namespace"], saga, meta["name"], revision_in(body))

    def _event(self, kind: str, parsed: UndoEntry | Unreadable) -> None:
        if isinstance(parsed, Unreadable):
            self.deliver(parsed)
            return
        if not self.owned(parsed):
            return
        deleted = kind == "DELETED"
        if deleted:
            self.index.deleted(parsed)
        else:
            self.index.keep(parsed)
        self.deliver((parsed, deleted))
