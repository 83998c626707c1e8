"""Every UndoEntry the operator watches, by saga: fed by one consistent LIST when it starts
leading, then by the watch's events, the operator's own write responses and the per-saga LISTs
that prove completeness.

The index spares a LIST for everything that does not need proof (an Active saga's depth, a
person's skip annotation, waking the right driver). What it holds is all of a saga's entries
only as far as a proof shows (a listing, or the watch's progress past a revision: the driver's
`prove` and docs/design.md say which).
"""

from __future__ import annotations

from collections import OrderedDict, defaultdict
from dataclasses import dataclass, field

from undolog.api import UndoEntry

SagaKey = tuple[str, str]
TOMBSTONES = 10_000
# The sagas whose entries are held parsed (the ones being driven, by recent use); the others'
# as JSON: parsed, an entry is ~8.5 KiB of Python objects, as JSON ~1.2 KiB, and 10,000 sagas
# hold 30,000 entries. Parsing one again takes ~20 us, which the sagas at work never pay.
HOT_SAGAS = 256
Shrunk = tuple[int | None, str]  # an entry's revision and JSON
Held = UndoEntry | Shrunk


@dataclass
class EntryIndex:
    _by_saga: dict[SagaKey, dict[str, Held]] = field(default_factory=lambda: defaultdict(dict))
    _hot: OrderedDict[SagaKey, None] = field(default_factory=OrderedDict)  # least recently used first
    # Deleted entries' last revision, so an older copy a driver still holds cannot bring one
    # back; the oldest are dropped past TOMBSTONES (such copies live for one reconcile).
    _deleted: OrderedDict[tuple[str, str], int] = field(default_factory=OrderedDict)

    def absent(self, namespace: str | None, listed: set[tuple[str, str]]) -> list[UndoEntry]:
        """The entries held, of one namespace or of all, whose (namespace, name) is not in `listed`."""
        return [
            _parsed(held)
            for (ns, _), entries in self._by_saga.items()
            if namespace in (None, ns)
            for name, held in entries.items()
            if (ns, name) not in listed
        ]

    def sagas(self) -> list[SagaKey]:
        """The sagas whose entries are held."""
        return [key for key, entries in self._by_saga.items() if entries]

    def deleted(self, entry: UndoEntry) -> None:
        namespace, name = entry.key
        self._by_saga[(namespace, entry.spec.saga)].pop(name, None)
        self._deleted[entry.key] = entry.metadata.revision or 0
        while len(self._deleted) > TOMBSTONES:
            self._deleted.popitem(last=False)

    def holds(self, namespace: str, saga: str, name: str, revision: int | None) -> bool:
        """Whether the copy held of the entry is the one at `revision`."""
        held = self._by_saga.get((namespace, saga), {}).get(name)
        return held is not None and revision is not None and _revision(held) == revision

    def restored(self, entry: UndoEntry) -> None:
        """An entry a watch saw deleted and that exists, read again (relabelled out of a shard's
        watch): kept, its tombstone cleared."""
        self._deleted.pop(entry.key, None)
        self.keep(entry)

    def keep(self, entry: UndoEntry) -> None:
        """A copy of an entry (from a listing, an event or a write response), if it is newer
        (when the revisions cannot be ordered, the copy just seen)."""
        gone = self._deleted.get(entry.key)
        revision = entry.metadata.revision
        if gone is not None and (revision is None or revision <= gone):
            return  # a copy from before its deletion
        key = (entry.metadata.namespace, entry.spec.saga)
        entries = self._by_saga[key]
        held = entries.get(entry.metadata.name)
        if held is not None:
            have = _revision(held)
            if have is not None and revision is not None and have >= revision:
                return
        entries[entry.metadata.name] = entry
        self._used(key)

    def replace(self, key: SagaKey, listed: list[UndoEntry]) -> list[UndoEntry]:
        """A saga's entries as just listed: what the listing lacks is gone (returned: deleted,
        perhaps before the watch says so), the rest newest wins."""
        names = {entry.metadata.name for entry in listed}
        held = self._by_saga[key]
        gone = [_parsed(held.pop(name)) for name in [n for n in held if n not in names]]
        for entry in listed:
            self.keep(entry)
        return gone

    def count(self, key: SagaKey) -> int:
        """How many entries of the saga are held (nothing parsed)."""
        return len(self._by_saga.get(key, ()))

    def of(self, key: SagaKey) -> dict[str, UndoEntry]:
        entries = self._by_saga.get(key)
        if not entries:
            return {}
        parsed = {name: _parsed(held) for name, held in entries.items()}
        entries.update(parsed)
        self._used(key)
        return parsed

    def forget(self, key: SagaKey) -> None:
        """The saga is gone: so are its entries (the garbage collector removes them)."""
        self._by_saga.pop(key, None)
        self._hot.pop(key, None)

    def _used(self, key: SagaKey) -> None:
        """The saga's entries stay parsed while it is among the HOT_SAGAS used last; the saga
        used longest ago is held as JSON from now on."""
        self._hot[key] = None
        self._hot.move_to_end(key)
        if len(self._hot) > HOT_SAGAS:
            cold, _ = self._hot.popitem(last=False)
            entries = self._by_saga.get(cold, {})
            for name, held in entries.items():
                entries[name] = _shrunk(held)


def _revision(held: Held) -> int | None:
    return held.metadata.revision if isinstance(held, UndoEntry) else held[0]


def _parsed(held: Held) -> UndoEntry:
    return held if isinstance(held, UndoEntry) else UndoEntry.model_validate_json(held[1])


def _shrunk(held: Held) -> Held:
    return (held.metadata.revision, held.model_dump_json(by_alias=True)) if isinstance(held, UndoEntry) else held
