"""What an engine remembers of each saga of its shard between events (small: kept for every
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

    def saw(self, saga: Saga) -> None:
        """The saga as last written or seen."""
        seen = self.setdefault(saga.key, Seen(None, None))
        seen.saw(saga.metadata.revision)
        seen.phase, seen.top_position = saga.status.phase, saga.status.top_position
