"""Deep stacks: one saga of N entries (strict LIFO, no dependsOn), aborted while the operator
is down, then an operator started: entries compensated a second, from the first call to the
last (the operator's start, its listing and its Lease are left out), and how much longer the
deepest stack takes than the shallowest. Per-entry work independent of the depth keeps the
rate flat and the ratio of times the ratio of depths.

    python -m bench.deep --depths 2000 10000
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from rich.progress import Progress
from tests.support.manifests import call, saga, undo_entry, webhook

from bench.compensation import bounded
from bench.harness import Bench, RemoteParticipant, bench_cluster, print_table, save


async def deep_saga(bench: Bench, namespace: str, depth: int, progress: Progress) -> None:
    created = await bench.kube.create("sagas", namespace, saga("deep", outcome="Abort"))
    uid = created["metadata"]["uid"]
    task = progress.add_task(f"registering {depth} entries", total=depth)

    async def one(position: int) -> None:
        entry = undo_entry("deep", position, owner_uid=uid, compensation=call("undo", p=position))
        entry["spec"]["effectId"] = f"{uid}:step{position}:fwd"
        await bench.kube.create("undoentries", namespace, entry)
        await bench.kube.patch_status("undoentries", namespace, f"deep-{position}", {"status": {"effect": "Committed"}})
        progress.advance(task)

    await bounded((lambda p=p: one(p) for p in range(1, depth + 1)), limit=50)  # type: ignore[misc]


async def measure(bench: Bench, depth: int, progress: Progress) -> dict[str, Any]:
    namespace = await bench.namespace(f"deep{depth}")
    participant = RemoteParticipant()
    try:
        await bench.kube.create("webhooks", namespace, webhook("undo", url=participant.url("/undo")))
        await deep_saga(bench, namespace, depth, progress)
        task = progress.add_task(f"compensating {depth} entries", total=depth)
        operator = bench.operator(namespace)
        try:
            while True:
                await asyncio.sleep(1.0)
                calls = await asyncio.to_thread(participant.received)
                progress.update(task, completed=len(calls))
                if len(calls) >= depth:
                    done = await bench.kube.get("sagas", namespace, "deep")
                    if done.get("status", {}).get("phase") == "Compensated":
                        break
        finally:
            operator.stop()
        seconds = calls[-1].at - calls[0].at
        in_order = [c.body["p"] for c in calls] == list(range(depth, 0, -1))
    finally:
        participant.close()
    return {
        "depth": depth,
        "first_to_last_call_seconds": round(seconds, 1),
        "entries_per_s": round((depth - 1) / seconds, 1),
        "lifo": in_order,
    }


async def main(depths: list[int]) -> None:
    with Progress() as progress:
        async with bench_cluster() as bench:
            rows = [await measure(bench, depth, progress) for depth in depths]
    shallow, deepest = rows[0], rows[-1]
    ratio = round(deepest["first_to_last_call_seconds"] / shallow["first_to_last_call_seconds"], 2)
    print_table(
        ["entries in one saga", "first to last call", "entries/s", "LIFO"],
        [[r["depth"], f"{r['first_to_last_call_seconds']} s", r["entries_per_s"], r["lifo"]] for r in rows],
    )
    print(f"{deepest['depth']} entries took {ratio}x the time of {shallow['depth']}")
    save("deep", {"depths": rows, "time_ratio": ratio})


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--depths", type=int, nargs="+", default=[2000, 10000])
    asyncio.run(main(parser.parse_args().depths))
