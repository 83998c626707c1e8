"""The SQLite store's transactions under concurrent calls of one process: each takes its turn
without blocking the event loop while another holds the database."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from undolog.participant import SqliteLedger, sqlite_transaction


def database(tmp_path: Path) -> str:
    path = str(tmp_path / "shop.db")
    with sqlite3.connect(path) as connection:
        SqliteLedger.create_tables(connection)
        connection.execute("CREATE TABLE charges (key text PRIMARY KEY)")
    return path


async def test_a_transaction_waits_its_turn_while_another_s_effect_awaits(tmp_path: Path) -> None:
    """The first holds the database while its effect awaits an outside call; the second, begun
    meanwhile, waits without stopping the loop (before, its BEGIN blocked the loop for the busy
    timeout and failed: database is locked); both commit, in the order they came."""
    path = database(tmp_path)
    transaction = sqlite_transaction(path)
    holding, answered = asyncio.Event(), asyncio.Event()

    async def charge(key: str, outside: asyncio.Event | None) -> None:
        async with transaction() as (_, connection):
            connection.execute("INSERT INTO charges (key) VALUES (?)", (key,))
            if outside is not None:
                holding.set()
                await outside.wait()

    first = asyncio.create_task(charge("first", answered))
    await holding.wait()
    second = asyncio.create_task(charge("second", None))
    for _ in range(5):  # the second runs up to where it waits
        await asyncio.sleep(0)
    assert not second.done()
    answered.set()  # the loop ran while the second waited: the outside call answers
    await asyncio.wait_for(asyncio.gather(first, second), 10)
    with sqlite3.connect(path) as connection:
        assert connection.execute("SELECT key FROM charges ORDER BY rowid").fetchall() == [("first",), ("second",)]


async def test_a_cancelled_call_leaves_nothing_and_the_next_goes_on(tmp_path: Path) -> None:
    path = database(tmp_path)
    transaction = sqlite_transaction(path)
    holding = asyncio.Event()

    async def stuck() -> None:
        async with transaction() as (_, connection):
            connection.execute("INSERT INTO charges (key) VALUES ('cancelled')")
            holding.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(stuck())
    await holding.wait()
    task.cancel()
    async with transaction() as (_, connection):
        connection.execute("INSERT INTO charges (key) VALUES ('next')")
    with sqlite3.connect(path) as connection:
        assert connection.execute("SELECT key FROM charges").fetchall() == [("next",)]
