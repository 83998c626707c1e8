"""What the participant kit's barrier costs a call: the p50 and p99 of a forward call (a charge)
to the same participant with the barrier and without it (the Idempotency-Key's answers only,
kept in memory), one call at a time: in Python (undolog.participant) on the same PostgreSQL
server (fsync on) and SQLite file, and in TypeScript (participant-kit/, built by `make
participant-kit`) on the same PostgreSQL server.

    python -m bench.participant_kit --calls 500
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from devtools.postgres import PASSWORD, LocalPostgres
from tests.cluster.test_participant_kit import kit_participant, node_participant

from bench.harness import print_table, save
from undolog.calls import protocol
from undolog.conventions import forward_key


def timed_calls(base: str, calls: int) -> list[float]:
    """Milliseconds of each forward call (a new key each: every one makes its effect)."""
    spent = []
    with httpx.Client(timeout=10) as client:
        for i in range(calls):
            key = forward_key(str(uuid.uuid4()), "charge")
            headers = protocol.headers(idempotency_key=key, saga="bench/kit", step="charge", org=None, attempt=1)
            began = time.perf_counter()
            answer = client.post(f"{base}/charge", json={"order": f"o-{i}", "amount": 1}, headers=headers)
            spent.append((time.perf_counter() - began) * 1000)
            assert answer.status_code == 200, answer.text
    return spent


def figures(spent: list[float]) -> dict[str, float]:
    ordered = sorted(spent)
    return {"p50_ms": round(statistics.median(ordered), 2), "p99_ms": round(ordered[int(len(ordered) * 0.99) - 1], 2)}


def warm_then_timed(base: str, calls: int) -> dict[str, float]:
    timed_calls(base, 20)  # warm: connections, pages
    return figures(timed_calls(base, calls))


def main(calls: int) -> None:
    results: dict[str, Any] = {"calls": calls}
    with tempfile.TemporaryDirectory(prefix="undolog-bench-kit-") as folder:
        postgres = LocalPostgres(Path(folder) / "postgres").up()
        try:
            for store, database in (
                ("postgres", ["--postgres", postgres.dsn]),
                ("sqlite", ["--sqlite", str(Path(folder) / "shop.db")]),
            ):
                for mode, extra in (("barrier", ()), ("keys_only", ("--naive",))):
                    with kit_participant(database, *extra) as base:
                        results[f"{store}_{mode}"] = warm_then_timed(base, calls)
            url = f"postgresql://undolog:{PASSWORD}@127.0.0.1:{postgres.port}/undolog"
            for mode, script in (("barrier", "example/example.mjs"), ("keys_only", "test/keys-only.mjs")):
                with node_participant(script, url) as base:
                    results[f"node_postgres_{mode}"] = warm_then_timed(base, calls)
        finally:
            postgres.down()
    print_table(
        ["store", "with the barrier p50/p99 ms", "keys only p50/p99 ms"],
        [
            [
                s,
                f"{results[f'{s}_barrier']['p50_ms']}/{results[f'{s}_barrier']['p99_ms']}",
                f"{results[f'{s}_keys_only']['p50_ms']}/{results[f'{s}_keys_only']['p99_ms']}",
            ]
            for s in ("postgres", "sqlite", "node_postgres")
        ],
        ledger="PostgreSQL with fsync on; SQLite with its defaults",
    )
    save("participant_kit", results)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=500)
    main(parser.parse_args().calls)
