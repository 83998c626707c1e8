"""What a part of the operator that follows a shard's sagas registers with its engine, as an
informer's handlers: the drivers, retention, the archive and the gauges each take what they
need from the saga watch; the engine routes nothing by name."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from undolog.api import Saga, UndoEntry
from undolog.controller.entry_index import SagaKey


class SagaConcern(Protocol):
    def seen(self, saga: Saga, *, written: bool) -> None:
        """A copy of one of the shard's sagas while the engine leads: from its watch (never one
        older than a copy seen or written), or `written` by its driver (a new phase)."""

    def gone(self, key: SagaKey) -> None:
        """The saga was deleted, or the engine no longer leads its shard."""

    def let_go(self, saga: Saga, entries: Sequence[UndoEntry]) -> None:
        """Its driver let the saga go, finished, holding these entries."""
