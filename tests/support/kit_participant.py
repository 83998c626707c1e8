"""A participant written with the kit (undolog.participant), as a process of its own: charges in
its database, refunded by the forward key; the barrier in the same transaction.

    python -m tests.support.kit_participant --port N (--sqlite PATH | --postgres DSN) [--web aiohttp|asgi]
        [--crash-between FILE]

`--crash-between FILE`: while FILE holds a number above 0, it is decremented and the process
kills itself (SIGKILL) after the charge is written and before the transaction commits: the
effect and the barrier's record are lost together.

A charge whose arguments say `seconds` awaits that long inside its transaction, as an outside
call (a payment API, a mail service) would.

`--naive`: no barrier, only what a team writes by hand: the Idempotency-Key's first answer kept
(in the same transaction), a compensation of a call never seen answered 200, and nothing
remembered of it: a forward call arriving after its compensation is applied."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
from pathlib import Path
from typing import Any

from aiohttp import web

from undolog.participant import (
    Answer,
    Barrier,
    PostgresLedger,
    SqliteLedger,
    aiohttp_handler,
    asgi_app,
    postgres_transaction,
    sqlite_transaction,
)
from undolog.participant.web import Transaction


def crash_if_asked(path: str | None) -> None:
    if path is None:
        return
    left = int(Path(path).read_text() or 0)
    if left > 0:
        Path(path).write_text(str(left - 1))
        os.kill(os.getpid(), signal.SIGKILL)


async def main(options: argparse.Namespace) -> None:
    transaction: Transaction
    if options.sqlite:
        import sqlite3

        with sqlite3.connect(options.sqlite) as lite:
            SqliteLedger.create_tables(lite)
            lite.execute("CREATE TABLE IF NOT EXISTS charges (key text PRIMARY KEY, amount integer)")
        transaction = sqlite_transaction(options.sqlite)
        mark = "?"
    else:
        from psycopg_pool import AsyncConnectionPool

        pool = AsyncConnectionPool(options.postgres, min_size=1, max_size=4, open=False)
        await pool.open()
        async with pool.connection() as setup:
            await PostgresLedger.create_tables(setup)
            await setup.execute("CREATE TABLE IF NOT EXISTS charges (key text PRIMARY KEY, amount integer)")
        transaction = postgres_transaction(pool)
        mark = "%s"

    async def run(connection: Any, sql: str, params: tuple[Any, ...]) -> None:
        done = connection.execute(sql.replace("?", mark), params)
        if asyncio.iscoroutine(done):
            await done

    async def charge(args: Any, connection: Any) -> Answer:
        key = f"charge-{args['order']}-{os.urandom(4).hex()}"
        await run(connection, "INSERT INTO charges (key, amount) VALUES (?, ?)", (key, int(args["amount"])))
        await asyncio.sleep(float(args.get("seconds", 0)))
        crash_if_asked(options.crash_between)
        return Answer(200, {"charge": key, "amount": args["amount"]})

    async def refund(args: Any, connection: Any, charged: Answer) -> Answer:
        key = (charged.body or {}).get("charge")
        await run(connection, "DELETE FROM charges WHERE key = ?", (key,))
        return Answer(200, {"refunded": key})

    if options.naive:
        await serve_naive(options, transaction, charge, refund)
        return
    barrier = Barrier(options.secret or None)
    if options.web == "asgi":
        import uvicorn

        routes = {
            "/charge": asgi_app(barrier, transaction, forward=charge),
            "/refund": asgi_app(barrier, transaction, compensation=refund),
        }

        async def app(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "lifespan":
                while (await receive())["type"] != "lifespan.shutdown":
                    await send({"type": "lifespan.startup.complete"})
                await send({"type": "lifespan.shutdown.complete"})
                return
            await routes[scope["path"]](scope, receive, send)

        await uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=options.port, log_level="warning")).serve()
        return
    application = web.Application()
    application.router.add_post("/charge", aiohttp_handler(barrier, transaction, forward=charge))
    application.router.add_post("/refund", aiohttp_handler(barrier, transaction, compensation=refund))
    runner = web.AppRunner(application)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", options.port).start()
    await asyncio.Event().wait()


async def serve_naive(options: argparse.Namespace, transaction: Any, charge: Any, refund: Any) -> None:
    """The participant without the barrier: keys only (its answers kept with the effect)."""
    answers: dict[str, Answer] = {}

    async def handle(request: web.Request) -> web.Response:
        key = request.headers.get("Idempotency-Key", "")
        forward = request.headers.get("Undolog-Forward-Key")
        if key not in answers:
            async with transaction() as (_, connection):
                args = await request.json()
                if forward is None:
                    answers[key] = await charge(args, connection)
                else:
                    charged = answers.get(forward)
                    answers[key] = await refund(args, connection, charged) if charged else Answer(200, {})
        answer = answers[key]
        return web.Response(status=answer.status, body=answer.encoded(), content_type="application/json")

    application = web.Application()
    application.router.add_post("/charge", handle)
    application.router.add_post("/refund", handle)
    runner = web.AppRunner(application)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", options.port).start()
    await asyncio.Event().wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--sqlite")
    parser.add_argument("--postgres")
    parser.add_argument("--web", default="aiohttp", choices=["aiohttp", "asgi"])
    parser.add_argument("--crash-between")
    parser.add_argument("--secret", action="append")
    parser.add_argument("--naive", action="store_true")
    asyncio.run(main(parser.parse_args()))
