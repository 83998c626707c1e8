"""What an informer remembers of each saga of its shard between events (small: kept for every
saga): what routes an entry's event to its saga's driver, and tells a late copy from news."""

from __future__ import annotations

from dataclasses import dataclass

from undolog.api import Saga, SagaPhase
from undolog.controller.entry_index import SagaKey


@dataclass(slots=True)
class Seen:
    phase: SagaPhase | None
    top_position: int | None
    revision: int | None = None  # of the newest copy seen or written: an older one is a late echo
    handed: int | None = None  # of the last copy every subscriber was handed: its echo is no news

    def saw(self, revision: int | None) -> None:
        if revision is not None and (self.revision is None or revision > self.revision):
            self.revision = revision


class SeenSagas(dict[SagaKey, Seen]):
    def late(self, saga: Saga) -> bool:
        """Whether this copy is older than one seen or written (the watch is behind a driver's
        write, by seconds under load): its phase and finalizer are history, not news."""
        seen, revision = self.get(saga.key), saga.metadata.revision
        if seen is None or seen.revision is None or revision is None:
            return False  # unknown: it may be news
        return revision < seen.revision

    def handed(self, key: SagaKey, revision: int | None) -> bool:
        """Whether the copy at `revision` is the one every subscriber was last handed (the watch's
        echo of a driver's phase write): nothing in it is news to any of them."""
        seen = self.get(key)
        return seen is not None and revision is not None and seen.handed == revision

    def saw(self, saga: Saga, *, handed: bool = False) -> None:
        """The saga as last written or seen (`handed`: to every subscriber)."""
        seen = self.setdefault(saga.key, Seen(None, None))
        seen.saw(saga.metadata.revision)
        seen.phase, seen.top_position = saga.status.phase, saga.status.top_position
        if handed:
            seen.handed = saga.metadata.revision
