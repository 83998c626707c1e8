"""What a guard adds to a compensation: N one-step sagas, each aborted and compensated before
the next, alternately guarded (the operator reads what the step left before sending the undo)
and not, against the same participant in the same run. Reported: p50 and p99 of the abort to
the undo's arrival at the participant for each, the difference, the guard read's own duration
(from the read's arrival to the undo's), and the API writes per compensation of each (the apiserver's counts,
over a block of each).

    python -m bench.guard --compensations 200
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from tests.support.manifests import webhook
from tests.support.participants import Participant

from bench.compensation import percentile
from bench.harness import Bench, bench_cluster, delta, print_table, save
from undolog.api import Call, Guard
from undolog.sdk import open_saga

BLOCK = 20  # sagas of each kind whose writes are counted


async def one(bench: Bench, namespace: str, participant: Participant, guarded: bool) -> tuple[float, float | None]:
    """Abort a saga of one step; the seconds until its undo arrived, and the ms from its guard's
    read arriving to its undo arriving (the read answered, judged, the undo sent)."""
    saga = await open_saga(generate_name="bench-", namespace=namespace, kubeconfig=str(bench.kubeconfig))
    guard = Guard(read=Call(function="read")) if guarded else None
    async with saga.step("charge", Call(function="undo"), guard=guard) as run:
        run.leaves({})  # what the read answers: the participant's empty object
    key = f"undo-{run.undo_id}"
    began = time.monotonic()
    await saga.abort("bench")
    await saga.close()
    arrived = await asyncio.to_thread(participant.wait_for, lambda r: any(x.key == key for x in r), 60)
    at = next(r.at for r in arrived if r.key == key)
    # Its read arrived after the abort and before the undo (one saga at a time).
    reads = [r.at for r in arrived if r.path == "/read" and began <= r.at <= at]
    return at - began, (at - reads[-1]) * 1000 if reads else None


async def run(compensations: int) -> dict[str, Any]:
    participant = Participant()
    async with bench_cluster() as bench:
        namespace = await bench.namespace("guard")
        for name in ("undo", "read"):
            await bench.kube.create("webhooks", namespace, webhook(name, url=participant.url(f"/{name}")))
        operator = bench.operator(namespace)
        try:
            await one(bench, namespace, participant, True)  # warm: the Webhooks cached, connections open
            latency: dict[bool, list[float]] = {False: [], True: []}
            reads: list[float] = []
            for index in range(2 * compensations):
                guarded = index % 2 == 1
                seconds, read = await one(bench, namespace, participant, guarded)
                latency[guarded].append(seconds * 1000)
                if read is not None:
                    reads.append(read)
            writes = {}
            for guarded in (False, True):
                before = await bench.writes()
                for _ in range(BLOCK):
                    await one(bench, namespace, participant, guarded)
                counted = delta(await bench.writes(), before)
                writes[guarded] = counted.get("undoentries", 0) / BLOCK
        finally:
            operator.stop()
    participant.close()
    figures = {
        kind: {"p50_ms": percentile(latency[g], 0.5), "p99_ms": percentile(latency[g], 0.99), "entry_writes": writes[g]}
        for kind, g in (("unguarded", False), ("guarded", True))
    }
    added = figures["guarded"]["p50_ms"] - figures["unguarded"]["p50_ms"]
    return figures | {
        "added_p50_ms": added,
        "guard_read_p50_ms": percentile(reads, 0.5),
        "compensations": compensations,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--compensations", type=int, default=200)
    results = asyncio.run(run(parser.parse_args().compensations))
    rows = [
        (kind, f"{results[kind]['p50_ms']:.1f}", f"{results[kind]['p99_ms']:.1f}", results[kind]["entry_writes"])
        for kind in ("unguarded", "guarded")
    ]
    print_table(["compensation", "abort → undo p50 ms", "p99 ms", "entry writes"], rows)
    print(
        f"a guard adds {results['added_p50_ms']:.1f} ms at p50; "
        f"from its read's arrival to the undo's: {results['guard_read_p50_ms']:.1f} ms at p50"
    )
    save("guard", results)


if __name__ == "__main__":
    main()
