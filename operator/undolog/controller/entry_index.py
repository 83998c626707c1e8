"""Every UndoEntry the operator watches, by saga: fed by one consistent LIST when it starts
leading, then by the watch's events, the operator's own write responses and the per-saga LISTs
that prove completeness.

The index spares a LIST for everything that does not need proof (an Active saga's depth, a
person's skip annotation, waking the right driver). It is never the proof that a saga's entries
are all known: a watch can lag (decisions.phases explains what proves it).
"""

from __future__ import annotations

from collections import OrderedDict, defaultdict
from dataclasses import dataclass, field

from undolog.api import UndoEntry
from undolog.ledger import newest

SagaKey = tuple[str, str]
TOMBSTONES = 10_000


@dataclass
class EntryIndex:
    _by_saga: dict[SagaKey, dict[str, UndoEntry]] = field(default_factory=lambda: defaultdict(dict))
    # Deleted entries' last revision, so an older copy a driver still holds cannot bring one
    # back; the oldest are dropped past TOMBSTONES (such copies live for one reconcile).
    _deleted: OrderedDict[tuple[str, str], int] = field(default_factory=OrderedDict)

    def held(self, namespace: str | None) -> list[UndoEntry]:
        """Every entry held, of one namespace or of all."""
        return [
            entry for (ns, _), entries in self._by_saga.items() if namespace in (None, ns) for entry in entries.values()
        ]

    def deleted(self, entry: UndoEntry) -> None:
        namespace, name = entry.key
        self._by_saga[(namespace, entry.spec.saga)].pop(name, None)
        self._deleted[entry.key] = entry.metadata.revision or 0
        while len(self._deleted) > TOMBSTONES:
            self._deleted.popitem(last=False)

    def keep(self, entry: UndoEntry) -> None:
        """A copy of an entry (from a listing, an event or a write response), if it is newer."""
        gone = self._deleted.get(entry.key)
        revision = entry.metadata.revision
        if gone is not None and (revision is None or revision <= gone):
            return  # a copy from before its deletion
        entries = self._by_saga[(entry.metadata.namespace, entry.spec.saga)]
        held = entries.get(entry.metadata.name)
        entries[entry.metadata.name] = newest(entry, held) or entry

    def replace(self, key: SagaKey, listed: list[UndoEntry]) -> list[UndoEntry]:
        """A saga's entries as just listed: what the listing lacks is gone (returned: deleted,
        perhaps before the watch says so), the rest newest wins."""
        names = {entry.metadata.name for entry in listed}
        held = self._by_saga[key]
        gone = [held.pop(name) for name in [n for n in held if n not in names]]
        for entry in listed:
            self.keep(entry)
        return gone

    def of(self, key: SagaKey) -> dict[str, UndoEntry]:
        return dict(self._by_saga.get(key, {}))

    def forget(self, key: SagaKey) -> None:
        """The saga is gone: so are its entries (the garbage collector removes them)."""
        self._by_saga.pop(key, None)
