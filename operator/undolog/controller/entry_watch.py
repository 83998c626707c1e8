"""UndoEntries as a shard's engine sees them: one ordered watch per watched namespace (or one
for all), of the shard's buckets, each event parsed once and applied to the index before the
engine hears of it. An entry labelled into the shard by hand that belongs to another is left
out (`owned`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from undolog.api import UndoEntry
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
    stream: OrderedWatch = field(init=False)

    def __post_init__(self) -> None:
        self.stream = OrderedWatch(
            self.kube, "undoentries", self.namespace, self._event, self._relisted, label_selector=self.label_selector
        )

    async def sync(self) -> list[EntryEvent]:
        """List consistently and load the index; returns what was listed, as events."""
        listed = [parse_entry(body) for body in await self.stream.sync()]
        return [
            e if isinstance(e, Unreadable) else (e, False) for e in listed if isinstance(e, Unreadable) or self.owned(e)
        ]

    async def run(self) -> None:
        await self.stream.run()

    @property
    def progress(self) -> Progress:
        return self.stream.progress

    def _event(self, kind: str, body: Body) -> None:
        parsed = parse_entry(body)
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

    def _relisted(self, items: list[Body]) -> None:
        """Entries held that the listing lacks were deleted while no stream was open: delivered
        as deletions (so a pending one is reported on its saga); the rest as changes, which
        wakes the sagas whose entries changed unseen."""
        listed = [p for p in map(parse_entry, items) if isinstance(p, Unreadable) or self.owned(p)]
        names = {e.key for e in listed if isinstance(e, UndoEntry)}
        for entry in self.index.held(self.namespace):
            if entry.key not in names:
                self.index.deleted(entry)
                self.deliver((entry, True))
        for parsed in listed:
            if isinstance(parsed, UndoEntry):
                self.index.keep(parsed)
            self.deliver(parsed if isinstance(parsed, Unreadable) else (parsed, False))
