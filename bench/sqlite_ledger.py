"""The single-machine alternative: a minimal in-process saga ledger on SQLite, on the same
workloads and participant as the operator, for the figure users would compare with.

Write-ahead: a step's row is committed (WAL, synchronous=FULL: durable like etcd's fsync)
before its call; the effect is marked after. Compensation walks the rows newest first. No
crash recovery across machines, no API, no RBAC, no HA: what UndoLog adds is what this lacks.

    python -m bench.sqlite_ledger
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from bench.compensation import percentile
from bench.harness import RemoteParticipant, print_table, save

SCHEMA = """
create table sagas (id text primary key, phase text not null);
create table entries (
    saga text not null, position integer not null, undo_id text not null, step text not null,
    effect text not null default 'Pending', state text not null default 'Pending',
    registered_at real not null, executed_at real, compensated_at real,
    primary key (saga, position)
);
"""


class Ledger:
    def __init__(self, path: Path) -> None:
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("pragma journal_mode=wal")
        self.db.execute("pragma synchronous=full")
        self.db.executescript(SCHEMA)
        self.writes = 0

    def write(self, sql: str, *args: Any) -> None:
        self.db.execute(sql, args)  # autocommit: one durable transaction per write
        self.writes += 1

    def open(self, saga: str) -> None:
        self.write("insert into sagas values (?, 'Active')", saga)

    def register(self, saga: str, position: int, step: str) -> str:
        undo_id = str(uuid.uuid4())
        self.write(
            "insert into entries (saga, position, undo_id, step, registered_at) values (?, ?, ?, ?, ?)",
            saga,
            position,
            undo_id,
            step,
            time.time(),
        )
        return undo_id

    def executed(self, saga: str, position: int) -> None:
        self.write(
            "update entries set effect='Committed', executed_at=? where saga=? and position=?",
            time.time(),
            saga,
            position,
        )

    def owed(self, saga: str) -> list[tuple[int, str, str]]:
        return self.db.execute(
            "select position, undo_id, step from entries where saga=? and state='Pending' order by position desc",
            (saga,),
        ).fetchall()

    def compensated(self, saga: str, position: int) -> None:
        self.write(
            "update entries set state='Compensated', compensated_at=? where saga=? and position=?",
            time.time(),
            saga,
            position,
        )

    def finish(self, saga: str, phase: str) -> None:
        self.write("update sagas set phase=? where id=?", phase, saga)


async def forward(ledger: Ledger, http: httpx.AsyncClient, url: str, saga: str) -> None:
    ledger.open(saga)
    for position, step in enumerate(("one", "two", "three"), start=1):
        ledger.register(saga, position, step)
        answer = await http.post(url, json={"step": step}, headers={"Idempotency-Key": f"{saga}:{step}:fwd"})
        answer.raise_for_status()
        ledger.executed(saga, position)
    ledger.finish(saga, "Completed")


async def compensate(ledger: Ledger, http: httpx.AsyncClient, url: str, saga: str) -> float:
    """Undo newest first; returns when the first compensation call was answered."""
    first = 0.0
    for position, undo_id, _ in ledger.owed(saga):
        answer = await http.post(url, json={"position": position}, headers={"Idempotency-Key": f"undo-{undo_id}"})
        answer.raise_for_status()
        first = first or time.monotonic()
        ledger.compensated(saga, position)
    ledger.finish(saga, "Compensated")
    return first


async def main(sizes: list[int], concurrency: list[int]) -> None:
    participant = RemoteParticipant()
    rows: dict[str, list[dict[str, Any]]] = {"forward": [], "compensation": []}
    try:
        with tempfile.TemporaryDirectory() as scratch:
            async with httpx.AsyncClient(limits=httpx.Limits(max_connections=200)) as http:
                await http.post(participant.url("/warm-up"), json={})
                for n in concurrency:
                    ledger = Ledger(Path(scratch) / f"forward-{n}.db")
                    walls: list[float] = []

                    async def timed(i: int, n: int = n, ledger: Ledger = ledger, walls: list[float] = walls) -> None:
                        began = time.monotonic()
                        await forward(ledger, http, participant.url("/work"), f"f{n}-{i}")
                        walls.append(time.monotonic() - began)

                    began = time.monotonic()
                    await asyncio.gather(*(timed(i) for i in range(n)))
                    elapsed = time.monotonic() - began
                    rows["forward"].append(
                        {
                            "concurrent_sagas": n,
                            "saga_wall_median_ms": round(statistics.median(walls) * 1000, 1),
                            "sagas_per_second": round(n / elapsed, 1),
                            "writes_per_step": round(ledger.writes / (3 * n), 2),
                        }
                    )
                for n in sizes:
                    ledger = Ledger(Path(scratch) / f"compensation-{n}.db")
                    for i in range(n):
                        ledger.open(f"c{i}")
                        for position in (1, 2, 3):
                            ledger.register(f"c{i}", position, f"step{position}")
                            ledger.executed(f"c{i}", position)
                    before = ledger.writes
                    began = time.monotonic()
                    firsts = await asyncio.gather(
                        *(compensate(ledger, http, participant.url("/undo"), f"c{i}") for i in range(n))
                    )
                    elapsed = time.monotonic() - began
                    latencies = [f - began for f in firsts]
                    rows["compensation"].append(
                        {
                            "sagas": n,
                            "abort_to_first_call_p50_ms": round(percentile(latencies, 0.5) * 1000, 1),
                            "abort_to_first_call_p99_ms": round(percentile(latencies, 0.99) * 1000, 1),
                            "compensations_per_second": round(3 * n / elapsed, 1),
                            "writes_per_saga": round((ledger.writes - before) / n, 1),
                        }
                    )
    finally:
        participant.close()
    print_table(
        ["SQLite ledger", "concurrent sagas", "saga wall p50", "sagas/s", "writes/step"],
        (
            (
                "forward",
                r["concurrent_sagas"],
                f"{r['saga_wall_median_ms']} ms",
                r["sagas_per_second"],
                r["writes_per_step"],
            )
            for r in rows["forward"]
        ),
    )
    print_table(
        ["SQLite ledger", "sagas", "first undo p50", "p99", "compensations/s"],
        (
            (
                "compensation",
                r["sagas"],
                f"{r['abort_to_first_call_p50_ms']} ms",
                f"{r['abort_to_first_call_p99_ms']} ms",
                r["compensations_per_second"],
            )
            for r in rows["compensation"]
        ),
    )
    save("sqlite", rows)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 10, 100, 1000])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 100])
    options = parser.parse_args()
    asyncio.run(main(options.sizes, options.concurrency))
