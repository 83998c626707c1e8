"""What one write of a saga costs the control plane, by the saga's steps: a saga of 3 steps, of
50 (the most a saga may have), and of 50 each depending on every step before it, each created and
then written as the operator writes it (a label patch, a status patch). Reported: the etcd and
kube-apiserver CPU per request, over `--writes` requests of each kind, one at a time (no
operator runs: the figures are the requests' own).

    python -m bench.saga_writes --writes 40
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from tests.support.manifests import saga, step

from bench.harness import Bench, bench_cluster, print_table, save

SHAPES = (("3 steps", 3, False), ("50 steps", 50, False), ("50 steps, each dependsOn every earlier", 50, True))


def steps(count: int, depending: bool) -> list[dict[str, Any]]:
    made: list[dict[str, Any]] = []
    for i in range(count):
        made.append(step(f"s{i}"))
        if depending and i:
            made[-1]["dependsOn"] = [f"s{j}" for j in range(i)]
    return made


async def cpu_ms(bench: Bench, requests: int, request: Callable[[int], Awaitable[Any]]) -> float:
    """Control-plane CPU per request, in ms."""
    before = bench.control_plane_cpu()
    for i in range(requests):
        await request(i)
    return round((bench.control_plane_cpu() - before) * 1000 / requests, 2)


async def measure(bench: Bench, writes: int) -> list[dict[str, Any]]:
    namespace = await bench.namespace("writes")
    return [await shape_row(bench, namespace, f"w{n}", shape, writes) for n, shape in enumerate(SHAPES)]


async def shape_row(
    bench: Bench, namespace: str, prefix: str, shape: tuple[str, int, bool], writes: int
) -> dict[str, Any]:
    kube, (label, count, depending) = bench.kube, shape
    names, body = [f"{prefix}-{i}" for i in range(writes)], steps(count, depending)
    created = await cpu_ms(bench, writes, lambda i: kube.create("sagas", namespace, saga(names[i], body)))
    labelled = await cpu_ms(
        bench, writes, lambda i: kube.patch("sagas", namespace, names[i], {"metadata": {"labels": {"n": str(i)}}})
    )
    status = await cpu_ms(
        bench, writes, lambda i: kube.patch_status("sagas", namespace, names[i], {"status": {"message": f"m{i}"}})
    )
    return {"saga": label, "create_cpu_ms": created, "label_patch_cpu_ms": labelled, "status_patch_cpu_ms": status}


async def main(writes: int) -> None:
    async with bench_cluster() as bench:
        rows = await measure(bench, writes)
    print_table(
        ["saga", "create", "label patch", "status patch"],
        (
            (r["saga"], f"{r['create_cpu_ms']} ms", f"{r['label_patch_cpu_ms']} ms", f"{r['status_patch_cpu_ms']} ms")
            for r in rows
        ),
    )
    save("saga_writes", rows)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--writes", type=int, default=40, help="requests of each kind for each saga shape")
    asyncio.run(main(parser.parse_args().writes))
