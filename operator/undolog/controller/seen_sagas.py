"""What an engine remembers of each saga of its shard between events (small: kept for every
saga), and the saga gauges that follow it while the engine leads."""

from __future__ import annotations

from dataclasses import dataclass

from undolog.api import Saga, SagaPhase
from undolog.controller.entry_index import SagaKey
from undolog.controller.gauges import SagaGauges


@dataclass(slots=True)
class Seen:
    phase: SagaPhase | None
    top_position: int | None
    halted_on: str | None = None
    revision: int | None = None  # of the newest copy seen or written: an older one is a late echo

    def saw(self, revision: int | None) -> None:
        if revision is not None and (self.revision is None or revision > self.revision):
            self.revision = revision


class SeenSagas(dict[SagaKey, Seen]):
    def __init__(self, gauges: SagaGauges) -> None:
        super().__init__()
        self.gauges = gauges

    def late(self, saga: Saga) -> bool:
        """Whether this copy is older than one seen or written (the watch is behind a driver's
        write, by seconds under load): its phase and finalizer are history, not news."""
        seen, revision = self.get(saga.key), saga.metadata.revision
        if seen is None or seen.revision is None or revision is None:
            return False  # unknown: it may be news
        return revision < seen.revision

    def moved(self, saga: Saga, halted_on: str | None, counted: bool) -> Seen:
        """The saga as last written or seen: its phase (and what it is halted on), counted in the
        gauges when `counted` (the engine leads)."""
        key, phase = saga.key, saga.status.phase
        seen = self.setdefault(key, Seen(None, None))
        seen.saw(saga.metadata.revision)
        if (seen.phase, seen.halted_on) != (phase, halted_on):
            if counted:
                self.gauges.moved(key[0], (seen.phase, seen.halted_on), (phase, halted_on))
            seen.phase, seen.halted_on = phase, halted_on
        return seen

    def drop(self, key: SagaKey, counted: bool) -> None:
        seen = self.pop(key, None)
        if seen is not None and counted:
            self.gauges.moved(key[0], (seen.phase, seen.halted_on), (None, None))
