"""What a part of the operator that follows a shard subscribes to its informer with
(controller/informer.py): the drivers, retention, the archive and the gauges each override
what they need of it; the informer routes nothing by name."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from undolog.api import Saga, UndoEntry
from undolog.controller.entry_index import SagaKey
from undolog.controller.entry_proof import Listed
from undolog.controller.entry_watch import EntryEvent


class ShardHandler:
    """Every method does nothing unless a part overrides it; the informer calls them while its
    shard is led (its watches run only then)."""

    def saga_seen(self, saga: Saga, *, written: bool) -> None:
        """A copy of one of the shard's sagas: from its watch (never one older than a copy seen
        or written), or `written` by its driver (a new phase)."""

    def saga_gone(self, key: SagaKey) -> None:
        """The saga was deleted, or the informer no longer leads its shard."""

    def saga_finished(self, saga: Saga, entries: Sequence[UndoEntry]) -> None:
        """Its driver let the saga go, finished, holding these entries."""

    def entry_seen(self, event: EntryEvent) -> None:
        """An entry of the shard changed or was deleted (already applied to the index), or one
        cannot be read."""

    def taking_charge(self, listed: Mapping[SagaKey, Listed]) -> None:
        """The shard's listings are about to be handed over; `listed`: the revision of each saga
        as listed just before its entries were (empty where that proves nothing)."""

    def took_charge(self) -> None:
        """Every listed saga and entry has been handed over and the watches follow on."""
