"""Orchestrated forward overhead benchmark (issue 4).

A 3-step orchestrated saga against a local participant, N at a time (N = 1 and 100), against
the same three HTTP calls made directly with no ledger. Reported: wall time per saga (median,
from the create call returning to the saga being seen Completed through a watch), and API
writes per step (the apiserver's own request counts, split by resource).

    python -m bench.forward --concurrency 1 100
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

import httpx
from tests.support.manifests import saga, webhook

from bench.compensation import bounded
from bench.harness import Bench, RemoteParticipant, bench_cluster, delta, go_ceiling, print_table, save

STEPS = ("one", "two", "three")


def three_steps() -> list[dict[str, Any]]:
    return [
        {
            "name": name,
            "action": {"function": "work", "args": {"step": name}},
            "compensation": {"function": "undo", "args": {"step": name}},
        }
        for name in STEPS
    ]


async def completions(bench: Bench, namespace: str, expected: int, seen: dict[str, float], done: asyncio.Event) -> None:
    """Record when each saga is first seen Completed, through a watch (no polling)."""

    def record(body: dict[str, Any]) -> None:
        if body.get("status", {}).get("phase") == "Completed":
            seen.setdefault(body["metadata"]["name"], time.monotonic())
            if len(seen) >= expected:
                done.set()

    listed, version = await bench.kube.list_versioned("sagas", namespace)
    for body in listed:
        record(body)
    while not done.is_set():  # the apiserver ends a watch after a while: resume where it ended
        async for _, body in bench.kube.watch("sagas", namespace, version):
            version = body["metadata"]["resourceVersion"]
            record(body)
            if done.is_set():
                return


async def direct(participant: RemoteParticipant, n: int) -> list[float]:
    """The same three calls per 'saga', no ledger: the floor."""
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=200)) as http:
        await http.post(participant.url("/warm-up"), json={})  # the client's one-time setup is not a call

        async def one(i: int) -> float:
            began = time.monotonic()
            for name in STEPS:
                answer = await http.post(
                    participant.url("/work"), json={"step": name}, headers={"Idempotency-Key": f"direct-{i}-{name}"}
                )
                answer.raise_for_status()
            return time.monotonic() - began

        return await asyncio.gather(*(one(i) for i in range(n)))


async def measure(bench: Bench, n: int) -> dict[str, Any]:
    kube = bench.kube
    namespace = await bench.namespace(f"fwd{n}")
    participant = RemoteParticipant()
    for function in ("work", "undo"):
        await kube.create("webhooks", namespace, webhook(function, url=participant.url(f"/{function}")))
    operator = bench.operator(namespace)
    try:
        seen: dict[str, float] = {}
        done = asyncio.Event()
        watcher = asyncio.create_task(completions(bench, namespace, n, seen, done))
        await asyncio.sleep(0.5)  # the watch is established
        before = await bench.writes()
        created: dict[str, float] = {}

        async def start(i: int) -> None:
            name = f"s{i:04d}"
            await kube.create("sagas", namespace, saga(name, three_steps()))
            created[name] = time.monotonic()

        began = time.monotonic()
        await bounded((lambda i=i: start(i) for i in range(n)), limit=100)  # type: ignore[misc]
        await asyncio.wait_for(done.wait(), 600)
        elapsed = time.monotonic() - began
        watcher.cancel()
        # Events are posted in the background: wait until the operator's writes settle.
        await asyncio.sleep(2.0)
        writes = delta(await bench.writes(), before)
        walls = [seen[name] - created[name] for name in created]
        floor = await direct(participant, n)
        ledger_writes = writes.get("sagas", 0) + writes.get("undoentries", 0)
        operator_writes = ledger_writes + writes.get("events", 0)
        entries = [e["metadata"]["name"] for e in await kube.list("undoentries", namespace)]
        go = await go_ceiling(bench, namespace, entries, max(operator_writes, 200), min(n, 100))
        operator_wps = operator_writes / elapsed
        return {
            "concurrent_sagas": n,
            "saga_wall_median_ms": round(statistics.median(walls) * 1000, 1),
            "direct_wall_median_ms": round(statistics.median(floor) * 1000, 1),
            "sagas_per_second": round(n / elapsed, 1),
            "api_writes": writes,
            "entry_writes_per_step": round(writes.get("undoentries", 0) / (3 * n), 2),
            "saga_writes_per_saga": round(writes.get("sagas", 0) / n, 2),
            "ledger_writes_per_step": round(ledger_writes / (3 * n), 2),
            "operator_writes_per_second": round(operator_wps, 1),
            **go.beside(operator_wps),
        }
    finally:
        operator.stop()
        participant.close()


async def main(levels: list[int]) -> None:
    rows = []
    async with bench_cluster() as bench:
        for n in levels:
            print(f"concurrency {n} ...", flush=True)
            row = await measure(bench, n)
            print(json.dumps(row), flush=True)
            rows.append(row)
    print_table(
        [
            "concurrent sagas",
            "saga wall p50",
            "3 direct calls p50",
            "sagas/s",
            "entry writes/step",
            "saga writes/saga",
            "operator writes/s",
            "Go client writes/s",
            "fraction",
        ],
        (
            (
                r["concurrent_sagas"],
                f"{r['saga_wall_median_ms']} ms",
                f"{r['direct_wall_median_ms']} ms",
                r["sagas_per_second"],
                r["entry_writes_per_step"],
                r["saga_writes_per_saga"],
                r["operator_writes_per_second"],
                r["go_ceiling_writes_per_second"],
                r["fraction_of_go_ceiling"],
            )
            for r in rows
        ),
    )
    save("forward", rows)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 100])
    asyncio.run(main(parser.parse_args().concurrency))
