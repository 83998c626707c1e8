"""The barrier's tables in the participant's own database, inside the transaction that makes the
effect: PostgreSQL through psycopg (an AsyncConnection in a transaction), or SQLite (a
sqlite3 connection, for the simplest services: one writer at a time). `create_tables` makes them once."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from undolog.participant.barrier import Answer

TABLES = (
    "CREATE TABLE IF NOT EXISTS undolog_barrier (key text PRIMARY KEY, kind text NOT NULL, "
    "forward_key text, status integer, body text)",
    "CREATE TABLE IF NOT EXISTS undolog_fences (shard text PRIMARY KEY, fence bigint NOT NULL)",
)


def _answer(status: int | None, body: str | None) -> Answer | None:
    return None if status is None else Answer(status, json.loads(body or "null"))


class PostgresLedger:
    """In `connection`'s open transaction (psycopg 3, async): INSERT ... ON CONFLICT waits for a
    concurrent transaction holding the same key, so the second of two calls sees the first's answer."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection

    async def claim(self, key: str, kind: str, forward_key: str | None) -> tuple[str, Answer | None] | None:
        cursor = await self.connection.execute(
            "INSERT INTO undolog_barrier (key, kind, forward_key) VALUES (%s, %s, %s) ON CONFLICT (key) DO NOTHING",
            (key, kind, forward_key),
        )
        if cursor.rowcount == 1:
            return None
        return await self.find(key)

    async def find(self, key: str) -> tuple[str, Answer | None] | None:
        cursor = await self.connection.execute("SELECT kind, status, body FROM undolog_barrier WHERE key = %s", (key,))
        row = await cursor.fetchone()
        return None if row is None else (row[0], _answer(row[1], row[2]))

    async def answered(self, key: str, answer: Answer) -> None:
        await self.connection.execute(
            "UPDATE undolog_barrier SET status = %s, body = %s WHERE key = %s",
            (answer.status, json.dumps(answer.body), key),
        )

    async def fence(self, shard: str, fence: int) -> int:
        cursor = await self.connection.execute(
            "INSERT INTO undolog_fences (shard, fence) VALUES (%s, %s) ON CONFLICT (shard) "
            "DO UPDATE SET fence = GREATEST(undolog_fences.fence, EXCLUDED.fence) RETURNING fence",
            (shard, fence),
        )
        row = await cursor.fetchone()
        return int(row[0])

    @staticmethod
    async def create_tables(connection: Any) -> None:
        for statement in TABLES:
            await connection.execute(statement)


class SqliteLedger:
    """In `connection`'s open transaction (sqlite3, `BEGIN IMMEDIATE`: one writer at a time)."""

    def __init__(self, connection: sqlite3.Connection) -> None:
        self.connection = connection

    async def claim(self, key: str, kind: str, forward_key: str | None) -> tuple[str, Answer | None] | None:
        cursor = self.connection.execute(
            "INSERT INTO undolog_barrier (key, kind, forward_key) VALUES (?, ?, ?) ON CONFLICT (key) DO NOTHING",
            (key, kind, forward_key),
        )
        if cursor.rowcount == 1:
            return None
        return await self.find(key)

    async def find(self, key: str) -> tuple[str, Answer | None] | None:
        row = self.connection.execute("SELECT kind, status, body FROM undolog_barrier WHERE key = ?", (key,)).fetchone()
        return None if row is None else (row[0], _answer(row[1], row[2]))

    async def answered(self, key: str, answer: Answer) -> None:
        self.connection.execute(
            "UPDATE undolog_barrier SET status = ?, body = ? WHERE key = ?",
            (answer.status, json.dumps(answer.body), key),
        )

    async def fence(self, shard: str, fence: int) -> int:
        self.connection.execute(
            "INSERT INTO undolog_fences (shard, fence) VALUES (?, ?) ON CONFLICT (shard) "
            "DO UPDATE SET fence = max(fence, excluded.fence)",
            (shard, fence),
        )
        row = self.connection.execute("SELECT fence FROM undolog_fences WHERE shard = ?", (shard,)).fetchone()
        return int(row[0])

    @staticmethod
    def create_tables(connection: sqlite3.Connection) -> None:
        for statement in TABLES:
            connection.execute(statement)
        connection.commit()


def sqlite_transaction(path: str) -> Callable[[], AbstractAsyncContextManager[tuple[SqliteLedger, sqlite3.Connection]]]:
    """Transactions of the SQLite database at `path` (`BEGIN IMMEDIATE`, committed when the
    call's block ends, rolled back on any error): the barrier's `transaction`.

    SQLite has one writer at a time, and a transaction holds it while the effect awaits (an
    outside call): this process's transactions take turns on an asyncio lock, in the order they
    came, so none blocks the event loop while another holds the database; what may wait on
    another process's writer (connecting, BEGIN, COMMIT) waits in a thread."""
    turn = asyncio.Lock()

    @asynccontextmanager
    async def transaction() -> AsyncIterator[tuple[SqliteLedger, sqlite3.Connection]]:
        async with turn:
            # Used by one transaction at a time, in a thread or on the loop: not bound to a thread.
            connection = sqlite3.connect(path, isolation_level=None, timeout=30, check_same_thread=False)
            try:
                await _waited(connection, "BEGIN IMMEDIATE")
                try:
                    yield SqliteLedger(connection), connection
                except BaseException:
                    await _waited(connection, "ROLLBACK")
                    raise
                await _waited(connection, "COMMIT")
            finally:
                connection.close()

    return transaction


async def _waited(connection: sqlite3.Connection, statement: str) -> None:
    """`statement` in a thread (it may wait for another process's writer), to its end even when
    the call is cancelled meanwhile: the connection is closed only after."""
    running = asyncio.ensure_future(asyncio.to_thread(connection.execute, statement))
    try:
        await asyncio.shield(running)
    except asyncio.CancelledError:
        await asyncio.wait([running])
        raise


def postgres_transaction(pool: Any) -> Callable[[], AbstractAsyncContextManager[tuple[PostgresLedger, Any]]]:
    """Transactions from a psycopg_pool AsyncConnectionPool (committed when the call's block
    ends, rolled back on any error): the barrier's `transaction`."""

    @asynccontextmanager
    async def transaction() -> AsyncIterator[tuple[PostgresLedger, Any]]:
        async with pool.connection() as connection, connection.transaction():
            yield PostgresLedger(connection), connection

    return transaction
