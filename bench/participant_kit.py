"""What the participant kit's barrier costs, and how each store holds under calls at once.

Throughput: forward calls (a charge each, a new key each) to the same participant with the
barrier and without it (the Idempotency-Key's answers only, kept in memory), with 1, 10 and 100
calls in flight: calls per second, p50 and p99. In Python (undolog.participant) on one
PostgreSQL server (fsync on) and one SQLite file, and in TypeScript (participant-kit/, built by
`make participant-kit`) on the same PostgreSQL server.

Under load: 10 and 100 keys at once, each charge awaiting 0.2 s in its transaction (an outside
call), each compensation sent 50 ms after its forward call: total time, slowest call, calls
unanswered, and charges left (none should be).

    python -m bench.participant_kit --calls 500
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
from devtools.postgres import PASSWORD, LocalPostgres
from tests.cluster.test_participant_kit import charges, kit_participant, node_participant
from tests.support import kit_load

from bench.harness import print_table, save
from undolog.calls import protocol
from undolog.conventions import forward_key

IN_FLIGHT = (1, 10, 100)
LOADS = (10, 100)  # keys at once, each effect awaiting EFFECT_SECONDS
EFFECT_SECONDS = 0.2


async def timed_calls(base: str, calls: int, in_flight: int) -> dict[str, float]:
    """`calls` forward calls (a new key each: every one makes its effect), `in_flight` at a
    time, after as many to open the client's connections (not counted)."""
    turns = asyncio.Semaphore(in_flight)
    limits = httpx.Limits(max_connections=in_flight, max_keepalive_connections=in_flight)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:

        async def one(i: int, spent: list[float]) -> None:
            key = forward_key(str(uuid.uuid4()), "charge")
            headers = protocol.headers(idempotency_key=key, saga="bench/kit", step="charge", org=None, attempt=1)
            async with turns:
                began = time.perf_counter()
                answer = await client.post(f"{base}/charge", json={"order": f"o-{i}", "amount": 1}, headers=headers)
                spent.append((time.perf_counter() - began) * 1000)
            assert answer.status_code == 200, answer.text

        await asyncio.gather(*(one(i, []) for i in range(max(in_flight, 20))))
        spent: list[float] = []
        began = time.perf_counter()
        await asyncio.gather(*(one(i, spent) for i in range(calls)))
        seconds = time.perf_counter() - began
    ordered = sorted(spent)
    return {
        "calls_per_s": round(calls / seconds, 1),
        "p50_ms": round(statistics.median(ordered), 2),
        "p99_ms": round(ordered[int(len(ordered) * 0.99) - 1], 2),
    }


async def throughput(base: str, calls: int) -> dict[str, dict[str, float]]:
    return {str(n): await timed_calls(base, calls, n) for n in IN_FLIGHT}


async def under_load(base: str, database: list[str]) -> dict[str, dict[str, Any]]:
    """The scenario of issue 59 at each size: every charge of the load compensated."""
    results = {}
    for keys in LOADS:
        emptied(database)
        load = await kit_load.keys_at_once(base, keys, compensate_after=0.05, effect_seconds=EFFECT_SECONDS)
        results[str(keys)] = {
            "seconds": round(load.seconds, 2),
            "slowest_call_s": round(load.slowest, 2),
            "unanswered": len(load.errors),
            "charges_left": len(charges(database)),
        }
    return results


def emptied(database: list[str]) -> None:
    kind, where = database
    if kind == "--sqlite":
        import sqlite3

        with sqlite3.connect(where) as connection:
            connection.execute("DELETE FROM charges")
        return
    with psycopg.connect(where) as connection:
        connection.execute("DELETE FROM charges")


def participants(folder: Path, postgres: LocalPostgres) -> Iterator[tuple[str, str, list[str], Any]]:
    """(kit, barrier or keys_only, its database, a context serving it at its base URL) for each."""
    url = f"postgresql://undolog:{PASSWORD}@127.0.0.1:{postgres.port}/undolog"
    postgres_db, sqlite_db = ["--postgres", postgres.dsn], ["--sqlite", str(folder / "shop.db")]
    for kit, database in (("python_postgres", postgres_db), ("python_sqlite", sqlite_db)):
        yield kit, "barrier", database, kit_participant(database)
        yield kit, "keys_only", database, kit_participant(database, "--naive")
    yield "node_postgres", "barrier", postgres_db, node_participant("example/example.mjs", url)
    yield "node_postgres", "keys_only", postgres_db, node_participant("test/keys-only.mjs", url)


async def measure(calls: int) -> dict[str, Any]:
    results: dict[str, Any] = {"calls": calls, "throughput": {}, "under_load": {}}
    with tempfile.TemporaryDirectory(prefix="undolog-bench-kit-") as folder:
        postgres = LocalPostgres(Path(folder) / "postgres").up()
        try:
            for kit, mode, database, serving in participants(Path(folder), postgres):
                with serving as base:
                    results["throughput"][f"{kit}_{mode}"] = await throughput(base, calls)
                    if mode == "barrier":
                        results["under_load"][kit] = await under_load(base, database)
        finally:
            postgres.down()
    return results


def main(calls: int) -> None:
    results = asyncio.run(measure(calls))
    rows = []
    for name, levels in results["throughput"].items():
        for n, figures in levels.items():
            rows.append([name, n, figures["calls_per_s"], f"{figures['p50_ms']}/{figures['p99_ms']}"])
    print_table(
        ["participant", "in flight", "calls/s", "p50/p99 ms"], rows, ledger="PostgreSQL with fsync on; SQLite defaults"
    )
    print_table(
        ["kit", "keys at once", "total s", "slowest call s", "unanswered", "charges left"],
        [
            [kit, keys, r["seconds"], r["slowest_call_s"], r["unanswered"], r["charges_left"]]
            for kit, sizes in results["under_load"].items()
            for keys, r in sizes.items()
        ],
        ledger=f"each charge awaiting {EFFECT_SECONDS} s in its transaction, each compensation 50 ms after",
    )
    save("participant_kit", results)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=500)
    main(parser.parse_args().calls)
