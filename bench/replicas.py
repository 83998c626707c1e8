"""Scale-out benchmark: 1, 2 and 4 operator processes sharing 4 shards compensate the same
number of sagas (3 entries each, made as the SDK makes them, bucket label included): total
sagas/s, CPU per saga of each process and of the control plane; then, with 2 replicas, one is
killed in the middle of a compensation run: how long until its shards' sagas are called again
(the Lease is the production default, 15 s).

    python -m bench.replicas --replicas 1 2 4 --sagas 300
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence
from typing import Any

from tests.support.identities import lease_holder
from tests.support.manifests import webhook
from tests.support.operator_process import OperatorProcess

from bench.compensation import _all, bounded, make_saga, until
from bench.harness import Bench, RemoteParticipant, bench_cluster, cpu_seconds, print_table, save

SHARDS = 4
LEASE_SECONDS = 15  # the chart's default


async def holders(bench: Bench, namespace: str) -> dict[int, str]:
    return {
        index: await lease_holder(bench.kube, namespace, f"undolog-operator-shard-{index}") for index in range(SHARDS)
    }


async def spread(bench: Bench, namespace: str, operators: Sequence[OperatorProcess]) -> dict[int, str]:
    """Wait until every shard is held and every replica holds its fair share."""
    share = -(-SHARDS // len(operators))
    deadline = time.monotonic() + 120
    while True:
        held = await holders(bench, namespace)
        counts = [list(held.values()).count(o.identity) for o in operators]
        if all(held.values()) and all(0 < c <= share for c in counts):
            return held
        if time.monotonic() > deadline:
            raise TimeoutError(f"shards not shared in 120 s: {held}")
        await asyncio.sleep(0.5)


def start(bench: Bench, namespace: str, replicas: int) -> list[OperatorProcess]:
    operators = [
        OperatorProcess(
            bench.kubeconfig,
            namespace,
            bench.work / "logs",
            (f"--shards={SHARDS}",),
            lease_namespace=namespace,
            lease_seconds=LEASE_SECONDS,
        )
        for _ in range(replicas)
    ]
    for operator in operators:
        operator.start()
    return operators


async def throughput(bench: Bench, replicas: int, n: int) -> dict[str, Any]:
    kube = bench.kube
    namespace = await bench.namespace(f"replicas{replicas}")
    participant = RemoteParticipant()
    await kube.create("webhooks", namespace, webhook("undo", url=participant.url("/undo")))
    operators = start(bench, namespace, replicas)
    try:
        await spread(bench, namespace, operators)
        names = [f"s{i:05d}" for i in range(n)]
        await bounded(lambda name=name: make_saga(kube, namespace, name) for name in names)  # type: ignore[misc]
        await until(lambda: _all(kube, namespace, "Active", n), 600, f"{n} sagas Active")
        await asyncio.sleep(1.0)
        pids = [o.process.pid for o in operators if o.process is not None]
        cpu_before = [cpu_seconds(pid) for pid in pids], bench.control_plane_cpu()
        began = time.monotonic()
        await bounded(
            lambda name=name: kube.patch("sagas", namespace, name, {"spec": {"outcome": "Abort"}})  # type: ignore[misc]
            for name in names
        )
        await participant.until(lambda received: len(received) >= 3 * n, 900)
        await until(lambda: _all(kube, namespace, "Compensated", n), 900, f"{n} sagas Compensated")
        span = time.monotonic() - began
        per_process = [cpu_seconds(pid) - before for pid, before in zip(pids, cpu_before[0], strict=True)]
        control_plane = bench.control_plane_cpu() - cpu_before[1]
        shards_seen = {r.headers.get("undolog-shard", "") for r in participant.received()}
        return {
            "replicas": replicas,
            "shards": SHARDS,
            "sagas": n,
            "sagas_per_second": round(n / span, 1),
            "seconds": round(span, 2),
            "operator_cpu_ms_per_saga_by_process": [round(c / n * 1000, 1) for c in per_process],
            "operator_cpu_ms_per_saga": round(sum(per_process) / n * 1000, 1),
            "control_plane_cpu_ms_per_saga": round(control_plane / n * 1000, 1),
            "shards_called": len(shards_seen),
        }
    finally:
        for operator in operators:
            operator.stop()
        participant.close()


async def hand_over(bench: Bench, n: int) -> dict[str, Any]:
    """Two replicas; one is killed while they compensate: its shards' next call, after the kill."""
    kube = bench.kube
    namespace = await bench.namespace("handover")
    participant = RemoteParticipant()
    await kube.create("webhooks", namespace, webhook("undo", url=participant.url("/undo")))
    operators = start(bench, namespace, 2)
    try:
        held = await spread(bench, namespace, operators)
        names = [f"s{i:05d}" for i in range(n)]
        await bounded(lambda name=name: make_saga(kube, namespace, name) for name in names)  # type: ignore[misc]
        await until(lambda: _all(kube, namespace, "Active", n), 600, f"{n} sagas Active")
        victim = operators[0]
        theirs = {f"{i}/{SHARDS}" for i, holder in held.items() if holder == victim.identity}
        await bounded(
            lambda name=name: kube.patch("sagas", namespace, name, {"spec": {"outcome": "Abort"}})  # type: ignore[misc]
            for name in names
        )
        await participant.until(lambda received: len(received) >= n // 4, 120)
        victim.kill()
        killed = time.monotonic()
        await participant.until(lambda received: len(received) >= 3 * n, 300)
        await until(lambda: _all(kube, namespace, "Compensated", n), 300, f"{n} sagas Compensated")
        received = participant.received()
        later = sorted(r.at - killed for r in received if r.at > killed and r.headers["undolog-shard"] in theirs)
        keys = {r.key for r in received}
        return {
            "replicas": 2,
            "lease_seconds": LEASE_SECONDS,
            "sagas": n,
            "killed_replica_shards": sorted(theirs),
            "seconds_to_its_shards_next_call": round(later[0], 2) if later else None,
            "calls": len(received),
            "distinct_keys": len(keys),
        }
    finally:
        for operator in operators:
            operator.stop()
        participant.close()


async def main(replicas: list[int], n: int, hand_over_sagas: int) -> None:
    async with bench_cluster() as bench:
        results = [await throughput(bench, r, n) for r in replicas]
        handed = await hand_over(bench, hand_over_sagas)
    print(f"\n{n} sagas x 3 entries compensated by N operator processes sharing {SHARDS} shards (2 cores)")
    print_table(
        ["replicas", "sagas/s", "seconds", "operator CPU ms/saga (each process)", "control plane CPU ms/saga"],
        [
            (
                r["replicas"],
                r["sagas_per_second"],
                r["seconds"],
                f"{r['operator_cpu_ms_per_saga']} ({', '.join(map(str, r['operator_cpu_ms_per_saga_by_process']))})",
                r["control_plane_cpu_ms_per_saga"],
            )
            for r in results
        ],
    )
    print(
        f"\nhand-over: a replica of 2 killed mid-compensation (Lease {LEASE_SECONDS} s); its shards "
        f"{handed['killed_replica_shards']} called again after {handed['seconds_to_its_shards_next_call']} s; "
        f"{handed['calls']} calls for {handed['distinct_keys']} keys"
    )
    save("replicas", {"throughput": results, "hand_over": handed})


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--sagas", type=int, default=300)
    parser.add_argument("--hand-over-sagas", type=int, default=200)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.replicas, arguments.sagas, arguments.hand_over_sagas))
