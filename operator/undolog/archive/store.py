"""The archive in PostgreSQL, through psycopg 3 and its pool: libpq's own connection strings and
environment (`PGHOST`, `PGPASSWORD`, `sslmode`, `sslrootcert`, service files) work as every
PostgreSQL tool reads them, and the driver is the one the PostgreSQL community maintains.

Writes are idempotent by saga UID: a saga archived again at the same revision changes nothing,
a newer revision (an entry registered late, a resolution) replaces the row. The schema is made
and moved forward by the migrations in `migrations/`, applied in order at start under an
advisory lock (a small versioned runner: two SQL files do not need a migration framework and
its dependencies in the operator's image).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from undolog import errors
from undolog.archive.record import ArchivedEvent, ArchivedSaga, HistoryQuery
from undolog.decisions import archive

RECONNECT_SECONDS = 1.0  # one attempt to connect gives up after this (then the next request tries anew)
MIGRATION_LOCK = 0x756E646F6C6F67  # "undolog": one runner at a time across replicas
SAGA_COLUMNS = (
    "uid, namespace, name, phase, reason, message, failure, org, functions, failed_step, created_at, started_at, "
    "finished_at, labels, revision, entries_revision"
)


# What a row's wholeness is judged on when it is not known whole: its saga's status and
# its entries' stack positions (not the entries themselves, which may be megabytes).
UNCHECKED_PARTS = (
    "CASE WHEN whole IS NOT TRUE THEN saga->'status' END, "
    "CASE WHEN whole IS NOT TRUE THEN (SELECT coalesce(jsonb_agg(jsonb_build_object('spec', "
    "jsonb_build_object('stackPosition', e->'spec'->'stackPosition'))), '[]'::jsonb) "
    "FROM jsonb_array_elements(entries) e) ELSE '[]'::jsonb END"
)


@dataclass(frozen=True)
class RowToCheck:
    uid: str
    namespace: str
    name: str
    whole: bool | None  # as recorded: None until checked, False once found partial
    missing: str | None  # why it is not whole; None: it is


class ArchiveUnavailable(errors.UndoLogError):
    """PostgreSQL cannot be reached (or refused the request): nothing was written."""


def _json(value: Any) -> str:
    # PostgreSQL's text and jsonb hold no NUL character, which a participant's answer may carry.
    return json.dumps(value, ensure_ascii=False).replace("\\u0000", "\\ufffd")


def _text(value: str | None) -> str | None:
    return None if value is None else value.replace("\x00", "\ufffd")


def migrations() -> list[tuple[int, str, str]]:
    """(version, name, SQL) of every migration shipped, in order."""
    folder = resources.files("undolog.archive") / "migrations"
    found = []
    for item in folder.iterdir():
        if item.name.endswith(".sql"):
            version = int(item.name.split("_", 1)[0])
            found.append((version, item.name, item.read_text()))
    return sorted(found)


class ArchiveStore:
    def __init__(self, dsn: str, *, max_connections: int = 4, timeout: float = 2.0) -> None:
        # The pool's own reconnection backs off without bound (1, 2, 4 ... s: after a minute's
        # outage its next try came up to 30 s after PostgreSQL was back). So each attempt to
        # connect gives up within a second, and the next request (the archive's retry clock,
        # at most a second apart) starts another: the server is noticed within a second or two.
        self.pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]] = AsyncConnectionPool(
            dsn,
            min_size=1,
            max_size=max_connections,
            timeout=timeout,
            open=False,
            check=AsyncConnectionPool.check_connection,  # a connection PostgreSQL dropped is replaced
            reconnect_timeout=RECONNECT_SECONDS,
            name="undolog-archive",
        )
        self.timeout = timeout

    async def open(self) -> None:
        await self.pool.open(wait=False)

    async def close(self) -> None:
        await self.pool.close()

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A connection in a transaction, committed when the block ends; every failure to reach
        PostgreSQL or to have it take the request is ArchiveUnavailable."""
        try:
            async with self.pool.connection(timeout=self.timeout) as connection:
                yield connection
        except PoolTimeout as error:
            raise ArchiveUnavailable(f"the archive cannot be reached: {error}") from None
        except psycopg.Error as error:
            raise ArchiveUnavailable(f"the archive refused the request: {str(error).strip()}") from None

    async def migrate(self) -> int:
        """Apply the migrations not applied yet; the schema's version after."""
        async with self.connection() as connection:
            await connection.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            await connection.execute(
                "CREATE TABLE IF NOT EXISTS undolog_schema_migrations "
                "(version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
            )
            cursor = await connection.execute("SELECT coalesce(max(version), 0) FROM undolog_schema_migrations")
            row = await cursor.fetchone()
            current = int(row[0]) if row else 0
            for version, name, sql in migrations():
                if version > current:
                    await connection.execute(sql.encode())
                    await connection.execute(
                        "INSERT INTO undolog_schema_migrations (version, name) VALUES (%s, %s)", (version, name)
                    )
                    current = version
            return current

    async def revisions(self, uids: Sequence[str]) -> dict[str, tuple[int, int]]:
        """(revision, entries revision) archived, by saga UID, of those archived whole: a row
        an earlier release wrote without some of its entries is not counted (it is written
        again, whole, before its saga may go)."""
        if not uids:
            return {}
        async with self.connection() as connection:
            cursor = await connection.execute(
                f"SELECT uid::text, revision, entries_revision, whole, {UNCHECKED_PARTS} FROM undolog_sagas "
                "WHERE uid = ANY(%s::uuid[])",
                (list(uids),),
            )
            found = await cursor.fetchall()
        return {
            uid: (revision, entries)
            for uid, revision, entries, whole, status, positions in found
            if whole or (whole is None and archive.missing_in({"status": status}, positions) is None)
        }

    async def unchecked(self, after: str | None, limit: int = 500) -> list[RowToCheck]:
        """Rows not known whole (an earlier release's, or found partial), by UID after `after`."""
        async with self.connection() as connection:
            cursor = await connection.execute(
                f"SELECT uid::text, namespace, name, whole, {UNCHECKED_PARTS} FROM undolog_sagas "
                "WHERE whole IS NOT TRUE AND uid > %s::uuid ORDER BY uid LIMIT %s",
                (after or "00000000-0000-0000-0000-000000000000", limit),
            )
            return [
                RowToCheck(uid, namespace, name, whole, archive.missing_in({"status": status}, positions))
                for uid, namespace, name, whole, status, positions in await cursor.fetchall()
            ]

    async def mark(self, uids: Sequence[str], whole: bool) -> None:
        """Record what a check found of rows an earlier release wrote."""
        if not uids:
            return
        async with self.connection() as connection:
            await connection.execute(
                "UPDATE undolog_sagas SET whole = %s WHERE uid = ANY(%s::uuid[])", (whole, list(uids))
            )

    async def write(
        self, sagas: Sequence[ArchivedSaga], events: Sequence[ArchivedEvent]
    ) -> list[tuple[ArchivedSaga, str]]:
        """Sagas (each whole: its entries, conditions, attempts) and events, in one transaction.
        A saga whose entries are not all there (decisions/archive.py) is refused, whatever
        path brought it: returned with why, and not written."""
        refused = [(s, why) for s in sagas if (why := archive.missing_in(s.saga, s.entries)) is not None]
        whole = [s for s in sagas if all(s is not r for r, _ in refused)]
        async with self.connection() as connection, connection.cursor() as cursor:
            if events:
                await cursor.executemany(INSERT_EVENT, [_event_row(e) for e in events])
            if whole:
                await cursor.executemany(UPSERT_SAGA, [_saga_row(s) for s in whole])
        return refused

    async def add_events(self, events: Sequence[ArchivedEvent]) -> None:
        await self.write([], events)

    async def history(self, query: HistoryQuery) -> list[ArchivedSaga]:
        """Archived sagas, newest finished first (their entries and events not read)."""
        where, params = _conditions(query)
        sql = (
            f"SELECT {SAGA_COLUMNS}, saga FROM undolog_sagas WHERE {where} ORDER BY finished_at DESC, uid DESC LIMIT %s"
        )
        async with self.connection() as connection, connection.cursor(row_factory=dict_row) as cursor:
            await cursor.execute(sql.encode(), [*params, query.limit])
            return [_archived(row, []) for row in await cursor.fetchall()]

    async def namespaces(self, query: HistoryQuery) -> list[str]:
        """The namespaces that hold archived sagas matching `query` (for the caller's checks)."""
        where, params = _conditions(query)
        async with self.connection() as connection:
            cursor = await connection.execute(
                f"SELECT DISTINCT namespace FROM undolog_sagas WHERE {where} ORDER BY namespace".encode(), params
            )
            return [row[0] for row in await cursor.fetchall()]

    async def saga(self, namespace: str, name: str) -> ArchivedSaga | None:
        """The latest archived saga of that name, with its entries and its timeline."""
        async with self.connection() as connection, connection.cursor(row_factory=dict_row) as cursor:
            await cursor.execute(
                f"SELECT {SAGA_COLUMNS}, saga, entries FROM undolog_sagas WHERE namespace = %s AND name = %s "
                "ORDER BY finished_at DESC LIMIT 1",
                (namespace, name),
            )
            row = await cursor.fetchone()
            if row is None:
                return None
            await cursor.execute(
                "SELECT saga_uid::text, sequence, at, kind, name, reason, message, warning FROM undolog_events "
                "WHERE saga_uid = %s ORDER BY sequence",
                (row["uid"],),
            )
            events = [ArchivedEvent(**e) for e in await cursor.fetchall()]
            return _archived(row, events)

    async def collect(self, before: datetime, batch: int = 1000) -> int:
        """Delete what finished (or happened) before `before`, a batch at a time: archive.ttl."""
        removed = 0
        while True:
            async with self.connection() as connection:
                cursor = await connection.execute(
                    "DELETE FROM undolog_sagas WHERE uid IN "
                    "(SELECT uid FROM undolog_sagas WHERE finished_at < %s LIMIT %s)",
                    (before, batch),
                )
                gone = cursor.rowcount
                await connection.execute(
                    "DELETE FROM undolog_events WHERE ctid IN (SELECT ctid FROM undolog_events WHERE at < %s LIMIT %s)",
                    (before, batch * 10),
                )
            removed += gone
            if gone < batch:
                return removed


INSERT_EVENT = (
    "INSERT INTO undolog_events (saga_uid, sequence, at, kind, name, reason, message, warning) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING"
)
_UPDATED = ", ".join(f"{column} = EXCLUDED.{column}" for column in (*SAGA_COLUMNS.split(", ")[1:], "saga", "entries"))
# A newer revision replaces a row, and so does any whole one a row not known whole.
UPSERT_SAGA = (
    f"INSERT INTO undolog_sagas ({SAGA_COLUMNS}, saga, entries, whole) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s::jsonb, %s, %s, %s::jsonb, %s::jsonb, true) "
    f"ON CONFLICT (uid) DO UPDATE SET {_UPDATED}, whole = true, archived_at = now() "
    "WHERE (undolog_sagas.revision, undolog_sagas.entries_revision) < (EXCLUDED.revision, EXCLUDED.entries_revision) "
    "OR undolog_sagas.whole IS NOT TRUE"
)


def _event_row(event: ArchivedEvent) -> tuple[Any, ...]:
    return (
        event.saga_uid,
        event.sequence,
        event.at,
        event.kind,
        event.name,
        _text(event.reason),
        _text(event.message),
        event.warning,
    )


def _saga_row(saga: ArchivedSaga) -> tuple[Any, ...]:
    return (
        saga.uid,
        saga.namespace,
        saga.name,
        saga.phase,
        saga.reason,
        _text(saga.message),
        _text(saga.failure),
        saga.org,
        saga.functions,
        saga.failed_step,
        saga.created_at,
        saga.started_at,
        saga.finished_at,
        _json(saga.labels),
        saga.revision,
        saga.entries_revision,
        _json(saga.saga),
        _json(saga.entries),
    )


def _archived(row: dict[str, Any], events: list[ArchivedEvent]) -> ArchivedSaga:
    return ArchivedSaga(
        uid=str(row["uid"]),
        namespace=row["namespace"],
        name=row["name"],
        phase=row["phase"],
        reason=row["reason"],
        message=row["message"],
        failure=row["failure"],
        org=row["org"],
        functions=list(row["functions"]),
        failed_step=row["failed_step"],
        created_at=row["created_at"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        labels=row["labels"],
        revision=row["revision"],
        entries_revision=row["entries_revision"],
        saga=row["saga"],
        entries=row.get("entries") or [],
        events=events,
    )


def _conditions(query: HistoryQuery) -> tuple[str, list[Any]]:
    """The WHERE clause of a history query (fixed fragments; the values as parameters)."""
    parts: list[str] = ["true"]
    params: list[Any] = []
    fragments: list[tuple[bool, str, list[Any]]] = [
        (query.namespaces is not None, "namespace = ANY(%s)", [query.namespaces]),
        (query.phase is not None, "phase = %s", [query.phase]),
        (query.org is not None, "org = %s", [query.org]),
        (query.principal is not None, "saga->'spec'->>'principal' = %s", [query.principal]),
        (query.function is not None, "%s = ANY(functions)", [query.function]),
        (query.name is not None, "name = %s", [query.name]),
        (query.since is not None, "finished_at >= %s", [query.since]),
        (query.until is not None, "finished_at < %s", [query.until]),
        (
            query.text is not None,
            "(reason ILIKE %s OR message ILIKE %s OR failure ILIKE %s)",
            [f"%{_like(query.text or '')}%"] * 3,
        ),
        (query.before is not None, "(finished_at, uid) < (%s, %s::uuid)", list(query.before or ())),
    ]
    for wanted, fragment, values in fragments:
        if wanted:
            parts.append(fragment)
            params.extend(values)
    return " AND ".join(parts), params


def _like(text: str) -> str:
    """`text` matched literally by ILIKE (its wildcards escaped)."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
