"""The archive: finished sagas, their entries and their timeline in PostgreSQL, kept after
retention deletes them from etcd (`undolog operator --archive-dsn`). The only code that
imports a database driver."""

from undolog.archive.record import ArchivedEvent, ArchivedSaga, HistoryQuery, archived_saga
from undolog.archive.store import ArchiveStore, ArchiveUnavailable

__all__ = ["ArchiveStore", "ArchiveUnavailable", "ArchivedEvent", "ArchivedSaga", "HistoryQuery", "archived_saga"]
