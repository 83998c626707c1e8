"""Scale benchmark (issue 7): N sagas with 3 entries each, all aborted while the operator is
down, then an operator is started: how long it takes to resume and finish all pending work,
and its resident memory, at N = 1,000 and 10,000.

    python -m bench.scale --sizes 1000 10000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

from rich.progress import Progress
from tests.support.manifests import call, saga, undo_entry, webhook

from bench.compensation import bounded
from bench.harness import Bench, RemoteParticipant, bench_cluster, cpu_seconds, print_table, save


def rss_mib(pid: int, field: str = "VmRSS") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


async def populate(bench: Bench, namespace: str, n: int, progress: Progress) -> None:
    kube = bench.kube
    task = progress.add_task(f"creating {n} aborted sagas", total=n)

    async def one(i: int) -> None:
        name = f"s{i:05d}"
        body = saga(name, outcome="Abort")
        body["metadata"]["finalizers"] = ["undolog.io/compensate-before-delete"]
        created = await kube.create("sagas", namespace, body)
        for position in (1, 2, 3):
            entry = undo_entry(
                name, position, owner_uid=created["metadata"]["uid"], compensation=call("undo", p=position)
            )
            await kube.create("undoentries", namespace, entry)
            await kube.patch_status("undoentries", namespace, f"{name}-{position}", {"status": {"effect": "Committed"}})
        progress.advance(task)

    await bounded((lambda i=i: one(i) for i in range(n)), limit=100)  # type: ignore[misc]


async def measure(bench: Bench, n: int, progress: Progress) -> dict[str, Any]:
    namespace = await bench.namespace(f"scale{n}")
    participant = RemoteParticipant()
    try:
        await bench.kube.create("webhooks", namespace, webhook("undo", url=participant.url("/undo")))
        await populate(bench, namespace, n, progress)
        task = progress.add_task(f"operator resuming {n} sagas", total=3 * n)
        began = time.monotonic()
        operator = bench.operator(namespace)
        assert operator.process is not None
        peak = 0.0
        try:
            while True:
                await asyncio.sleep(1.0)
                peak = max(peak, rss_mib(operator.process.pid))
                done = len(await asyncio.to_thread(participant.received))
                progress.update(task, completed=min(done, 3 * n))
                if done >= 3 * n:
                    sagas = await bench.kube.list("sagas", namespace)
                    if all(s.get("status", {}).get("phase") == "Compensated" for s in sagas):
                        break
            elapsed = time.monotonic() - began
            peak = max(peak, rss_mib(operator.process.pid, "VmHWM"))
            settled = rss_mib(operator.process.pid)
        finally:
            operator.stop()
        return {
            "sagas": n,
            "entries": 3 * n,
            "resume_and_finish_seconds": round(elapsed, 1),
            "compensations_per_second": round(3 * n / elapsed, 1),
            "operator_peak_rss_mib": round(peak, 1),
            "operator_rss_after_mib": round(settled, 1),
        }
    finally:
        participant.close()


async def idle(bench: Bench, cpu_seconds_measured: float = 20.0) -> dict[str, float]:
    """An operator with nothing to do: started, leading, watching an empty namespace. Its resident
    memory, sampled for 3 s once it is up (the largest sample), and the CPU it spends a second
    after that (renewing its Leases, serving nothing), over `cpu_seconds_measured`."""
    namespace = await bench.namespace("idle")
    operator = bench.operator(namespace)
    assert operator.process is not None
    try:
        await asyncio.sleep(2.0)  # the Lease taken, the watches listed
        samples = []
        for _ in range(6):
            samples.append(rss_mib(operator.process.pid))
            await asyncio.sleep(0.5)
        before = cpu_seconds(operator.process.pid)
        await asyncio.sleep(cpu_seconds_measured)
        spent = cpu_seconds(operator.process.pid) - before
        cpu_ms_per_s = round(spent * 1000 / cpu_seconds_measured, 1)
        return {"operator_rss_mib": round(max(samples), 1), "operator_cpu_ms_per_s": cpu_ms_per_s}
    finally:
        operator.stop()


async def main(sizes: list[int]) -> None:
    rows = []
    with Progress() as progress:
        async with bench_cluster() as bench:
            at_rest = await idle(bench)
            rss, cpu = at_rest["operator_rss_mib"], at_rest["operator_cpu_ms_per_s"]
            progress.console.print(f"idle operator: {rss} MiB, {cpu} ms of CPU a second")
            save("idle", at_rest)
            for n in sizes:
                row = await measure(bench, n, progress)
                progress.console.print(json.dumps(row))
                rows.append(row)
    print_table(
        ["sagas", "entries", "resume and finish", "compensations/s", "operator peak RSS", "RSS after"],
        (
            (
                r["sagas"],
                r["entries"],
                f"{r['resume_and_finish_seconds']} s",
                r["compensations_per_second"],
                f"{r['operator_peak_rss_mib']} MiB",
                f"{r['operator_rss_after_mib']} MiB",
            )
            for r in rows
        ),
    )
    save("scale", rows)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    asyncio.run(main(parser.parse_args().sizes))
