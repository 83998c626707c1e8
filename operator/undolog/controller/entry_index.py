"""Every UndoEntry the operator watches, by saga: one consistent LIST when it starts leading,
then the watch's events and the operator's own write responses.

Listing a saga's entries from the apiserver costs a scan of every entry in its namespace
(field and label selectors are not indexed for custom resources), so at thousands of sagas
per-saga LISTs dominate the apiserver's CPU. The index answers instead, when it is known to be
complete: the watch delivers a namespace's entry events in resourceVersion order and they are
applied in that order (controller.entry_watch), so once it has applied (or the priming LIST
covered) revision R, every entry written before R is here. When that cannot be shown, the
driver lists (and the listing refreshes the index).
"""

from __future__ import annotations

from collections import OrderedDict, defaultdict
from dataclasses import dataclass, field

from undolog.kube import Body

SagaKey = tuple[str, str]
TOMBSTONES = 10_000


def revision(body: Body | str) -> int | None:
    """An etcd revision as an integer; None when the resourceVersion is not one (then: list)."""
    value = body if isinstance(body, str) else body.get("metadata", {}).get("resourceVersion", "")
    return int(value) if value.isascii() and value.isdigit() else None


@dataclass
class EntryIndex:
    clusterwide: bool = True  # one watch stream for all namespaces: its progress covers them all
    _by_saga: dict[SagaKey, dict[str, Body]] = field(default_factory=lambda: defaultdict(dict))
    _progress: dict[str, int] = field(default_factory=dict)  # namespace -> revision reflected
    # Deleted entries' last revision, so an older copy a driver still holds cannot bring one
    # back; the oldest are dropped past TOMBSTONES (such copies live for one reconcile).
    _deleted: OrderedDict[tuple[str, str], int] = field(default_factory=OrderedDict)
    _everywhere: int = 0

    def prime(self, items: list[Body], version: str, namespace: str | None) -> None:
        """Load a consistent listing (of one namespace, or of all when `namespace` is None)."""
        for body in items:
            self.keep(body)
        self.reached(namespace, version)

    def reached(self, namespace: str | None, version: str) -> None:
        """Every change of the namespace (of all, for None) up to `version` has been applied."""
        seen = revision(version)
        if seen is None:
            return
        if namespace is None:
            self._everywhere = max(self._everywhere, seen)
        else:
            self._progress[namespace] = max(self._progress.get(namespace, 0), seen)

    def held(self, namespace: str | None) -> list[Body]:
        """Every entry held, of one namespace or of all."""
        return [
            body for (ns, _), entries in self._by_saga.items() if namespace in (None, ns) for body in entries.values()
        ]

    def watched(self, body: Body, deleted: bool) -> None:
        """An event from the watch, applied in the stream's order: apply it, and record how far
        the stream has come."""
        if deleted:
            meta = body["metadata"]
            self._by_saga[(meta["namespace"], body["spec"]["saga"])].pop(meta["name"], None)
            self._deleted[(meta["namespace"], meta["name"])] = revision(body) or 0
            while len(self._deleted) > TOMBSTONES:
                self._deleted.popitem(last=False)
        else:
            self.keep(body)
        self.reached(
            None if self.clusterwide else body["metadata"]["namespace"], body["metadata"].get("resourceVersion", "")
        )

    def keep(self, body: Body) -> None:
        """A copy of an entry (from a listing, an event or a write response), if it is newer."""
        meta = body["metadata"]
        new = revision(body)
        gone = self._deleted.get((meta["namespace"], meta["name"]))
        if gone is not None and (new is None or new <= gone):
            return  # a copy from before its deletion
        entries = self._by_saga[(meta["namespace"], body["spec"]["saga"])]
        held = entries.get(meta["name"])
        old = revision(held) if held else None
        if held is None or new is None or old is None or new >= old:
            entries[meta["name"]] = body

    def replace(self, key: SagaKey, listed: list[Body]) -> list[Body]:
        """A saga's entries as just listed: what the listing lacks is gone (returned: deleted,
        perhaps before the watch says so), the rest newest wins."""
        names = {body["metadata"]["name"] for body in listed}
        held = self._by_saga[key]
        gone = [held.pop(name) for name in [n for n in held if n not in names]]
        for body in listed:
            self.keep(body)
        return gone

    def complete_at(self, namespace: str, version: str) -> bool:
        """Whether every entry written before resourceVersion `version` is in the index."""
        wanted = revision(version)
        if wanted is None:
            return False
        return max(self._everywhere, self._progress.get(namespace, 0)) >= wanted

    def of(self, key: SagaKey) -> dict[str, Body]:
        return dict(self._by_saga.get(key, {}))

    def forget(self, key: SagaKey) -> None:
        """The saga is gone: so are its entries (the garbage collector removes them)."""
        self._by_saga.pop(key, None)
