"""Abort-to-compensation benchmark (issue 3).

N external sagas with 3 committed entries each are aborted together. Reported per N:
- latency from the abort (the API accepted spec.outcome=Abort) to the saga's first
  compensation call arriving at the participant: p50 and p99;
- compensations per second, from the first abort to the last compensation call;
- API writes the operator made (the apiserver's own request counts), per saga;
- the raw ceiling: the same number of writes made by a plain client with no operator, and
  how long the operator took compared with that.

    python -m bench.compensation --sizes 1 10 100 1000
    python -m bench.compensation --idle-samples 0 --sizes --rounds 3   (the bursts of ten against both floors)
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import statistics
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import AbstractAsyncContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any, Literal

from tests.support.manifests import call, saga, undo_entry, webhook

from bench.call_counts import counted, environment
from bench.harness import (
    Bench,
    RemoteParticipant,
    bench_cluster,
    cpu_seconds,
    delta,
    floor_client,
    go_ceiling,
    print_table,
    profiled,
    save,
)
from bench.profile import report
from undolog.conventions import bucket_labels
from undolog.kube import Kube


async def bounded(jobs: Iterable[Callable[[], Awaitable[Any]]], limit: int = 100) -> list[Any]:
    gate = asyncio.Semaphore(limit)

    async def one(job: Callable[[], Awaitable[Any]]) -> Any:
        async with gate:
            return await job()

    return await asyncio.gather(*(one(j) for j in jobs))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def phases(kube: Kube, namespace: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for body in await kube.list("sagas", namespace):
        phase = body.get("status", {}).get("phase", "New")
        counts[phase] = counts.get(phase, 0) + 1
    return counts


async def until(probe: Callable[[], Awaitable[bool]], within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not await probe():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached in {within} s")
        await asyncio.sleep(0.2)


async def abort(kube: Kube, namespace: str, name: str, at: dict[str, float]) -> None:
    """Abort the saga; `at[name]` is when the API accepted it."""
    await kube.patch("sagas", namespace, name, {"spec": {"outcome": "Abort"}})
    at[name] = time.monotonic()


async def make_saga(kube: Kube, namespace: str, name: str) -> None:
    """A saga with 3 committed entries, as the SDK makes them (bucket label included)."""
    labels = bucket_labels(namespace, name)
    body = saga(name)
    body["metadata"]["labels"] = labels
    created = await kube.create("sagas", namespace, body)
    uid = created["metadata"]["uid"]
    for position in (1, 2, 3):
        body = undo_entry(name, position, owner_uid=uid, compensation=call("undo", position=position))
        body["metadata"]["labels"] = labels
        body["spec"]["effectId"] = f"{uid}:step{position}:fwd"
        await kube.create("undoentries", namespace, body)
        await kube.patch_status("undoentries", namespace, f"{name}-{position}", {"status": {"effect": "Committed"}})


async def raw_ceiling(kube: Kube, namespace: str, writes: int, concurrency: int) -> float:
    """Seconds a plain client needs for `writes` status patches at the same concurrency."""
    entries = [e["metadata"]["name"] for e in await kube.list("undoentries", namespace)]
    began = time.monotonic()
    await bounded(
        (
            functools.partial(
                kube.patch_status, "undoentries", namespace, entries[i % len(entries)], {"status": {"retryCount": i}}
            )
            for i in range(writes)
        ),
        limit=concurrency,
    )
    return time.monotonic() - began


async def measure(bench: Bench, n: int, profile: Path | None = None) -> dict[str, Any]:
    kube = bench.kube
    namespace = await bench.namespace(f"comp{n}")
    participant = RemoteParticipant()
    await kube.create("webhooks", namespace, webhook("undo", url=participant.url("/undo")))
    operator = bench.operator(namespace)
    try:
        names = [f"s{i:05d}" for i in range(n)]
        await bounded(lambda name=name: make_saga(kube, namespace, name) for name in names)  # type: ignore[misc]
        await until(lambda: _all(kube, namespace, "Active", n), 600, f"{n} sagas Active")
        # Let the operator settle (stackDepth writes for the entries) before counting writes.
        await asyncio.sleep(1.0)
        before = await bench.writes()
        assert operator.process is not None
        cpu_before = (cpu_seconds(operator.process.pid), bench.control_plane_cpu())
        aborted_at: dict[str, float] = {}

        sampled = None if profile is None else profile / f"compensation-{n}.txt"
        async with profiled(operator.process.pid, sampled):
            first_abort = time.monotonic()
            await bounded(lambda name=name: abort(kube, namespace, name, aborted_at) for name in names)  # type: ignore[misc]
            # Wait on the participant first: polling the API would take the apiserver's CPU.
            await participant.until(lambda received: len(received) >= 3 * n, 900)
            await until(lambda: _all(kube, namespace, "Compensated", n), 900, f"{n} sagas Compensated")
        if sampled is not None:
            print(report(sampled, per=3 * n, rate=250), flush=True)
        after = await bench.writes()
        cpu = (cpu_seconds(operator.process.pid) - cpu_before[0], bench.control_plane_cpu() - cpu_before[1])
        received = participant.received()
        first_call: dict[str, float] = {}
        for request in received:
            name = request.headers["undolog-saga"].split("/", 1)[1]
            first_call.setdefault(name, request.at)
        latencies = [first_call[name] - aborted_at[name] for name in names]
        # More calls than entries are allowed only as repeats of a key (retries, replays after a
        # lost answer): counted, with the attempt number each repeat carried.
        keys = Counter(request.key for request in received)
        repeats = Counter(r.headers.get("undolog-attempt", "?") for r in received if keys[r.key] > 1)
        span = max(r.at for r in received) - first_abort
        writes = delta(after, before)
        total_writes = sum(writes.values())
        ceiling = await raw_ceiling(kube, namespace, total_writes, min(n, 100))
        entries = [e["metadata"]["name"] for e in await kube.list("undoentries", namespace)]
        go = await go_ceiling(bench, namespace, entries, max(total_writes, 200), min(n, 100))
        operator_wps = (total_writes - n) / span  # the abort patches are the benchmark's own
        return {
            "sagas": n,
            "compensations": len(received),
            "distinct_keys": len(keys),
            "calls_by_attempt_of_repeated_keys": dict(repeats),
            "abort_to_first_call_p50_ms": round(percentile(latencies, 0.5) * 1000, 1),
            "abort_to_first_call_p99_ms": round(percentile(latencies, 0.99) * 1000, 1),
            "compensations_per_second": round(len(received) / span, 1),
            "operator_seconds": round(span, 2),
            "api_writes": writes,
            "api_writes_per_saga": round(total_writes / n, 1),
            "raw_ceiling_seconds": round(ceiling, 2),
            "raw_writes_per_second": round(total_writes / ceiling, 1),
            "operator_vs_ceiling": round(span / ceiling, 2),
            "operator_writes_per_second": round(operator_wps, 1),
            **go.beside(operator_wps),
            "mean_latency_ms": round(statistics.fmean(latencies) * 1000, 1),
            "operator_cpu_seconds": round(cpu[0], 2),
            "control_plane_cpu_seconds": round(cpu[1], 2),
        }
    finally:
        operator.stop()
        participant.close()


async def _all(kube: Kube, namespace: str, phase: str, n: int) -> bool:
    return (await phases(kube, namespace)).get(phase, 0) == n


@contextmanager
def operator_of(bench: Bench, namespace: str) -> Iterator[int]:
    """An operator of `namespace` while the block runs; yields its pid."""
    operator = bench.operator(namespace)
    assert operator.process is not None
    try:
        yield operator.process.pid
    finally:
        operator.stop()


Floor = Literal["go", "python"]
FLOOR_PREFIX: dict[Floor, str] = {"go": "floor-", "python": "pyfloor-"}


async def burst_latency(
    bench: Bench, size: int, bursts: int, *, floor: Floor | None = None, profile: Path | None = None
) -> dict[str, Any]:
    """Abort to first compensation call on an operator with nothing else to do: `bursts` times,
    `size` sagas aborted together, each burst once the previous one is compensated. One saga at
    a time gives the idle figure; bursts of 10 give the 10-at-once figure over enough samples
    (one burst of 10 moved between 65 and 180 ms from run to run). `floor`: the sagas are
    compensated by bench/goclients/floor instead, the least any controller does (harness.floor_client),
    or by its requests made from Python (bench/python_floor.py). `profile`: where py-spy's
    stacks of the controller during the bursts go (the operator's, or the Python floor's).
    Either way they are sagas an operator made Active: a write costs the apiserver more the
    larger its object is (a saga patch 3 ms of control-plane CPU without a status, 6 with the
    operator's), and a floor handed bare sagas measured a cheaper job than any controller's."""
    kube = bench.kube
    namespace = await bench.namespace(
        ("" if floor is None else FLOOR_PREFIX[floor]) + ("idle" if size == 1 else f"burst{size}")
    )
    participant = RemoteParticipant()
    await kube.create("webhooks", namespace, webhook("undo", url=participant.url("/undo")))
    names = [[f"b{burst:03d}-{i:02d}" for i in range(size)] for burst in range(bursts)]
    total = size * bursts
    latencies: list[float] = []

    async def aborted_in_bursts(pid: int) -> tuple[float, float]:
        """The bursts, compensated by process `pid`: what it and the control plane spent."""
        cpu_before = cpu_seconds(pid), bench.control_plane_cpu()
        for count, burst in enumerate(names, start=1):
            await asyncio.sleep(0.3)  # idle: the operator has nothing else to do (a pause, not a wait)
            aborted: dict[str, float] = {}
            await asyncio.gather(*(abort(kube, namespace, name, aborted) for name in burst))
            received = await participant.until(lambda r, count=count: len(r) >= 3 * size * count, 60)  # type: ignore[misc]
            for name in burst:
                first = min(r.at for r in received if r.headers["undolog-saga"].endswith(f"/{name}"))
                latencies.append(first - aborted[name])
        return cpu_seconds(pid) - cpu_before[0], bench.control_plane_cpu() - cpu_before[1]

    try:
        with operator_of(bench, namespace) as pid:
            await bounded(lambda name=name: make_saga(kube, namespace, name) for burst in names for name in burst)  # type: ignore[misc]
            await until(lambda: _all(kube, namespace, "Active", total), 120, f"{total} sagas Active")
            if floor is None:
                async with profiled(pid, profile), counted(pid) as calls:
                    cpu = await aborted_in_bursts(pid)
        if floor is not None:
            with floor_client(bench, namespace, participant.url("/undo"), python=floor == "python") as pid:
                counting: AbstractAsyncContextManager[dict[str, int]] = (
                    counted(pid) if floor == "python" else nullcontext({})
                )
                async with profiled(pid, profile), counting as calls:
                    cpu = await aborted_in_bursts(pid)
    finally:
        participant.close()
    # What the controller and the control plane spent on the 2 cores per aborted saga, from the
    # first abort to the last burst's calls (pauses and all but that burst's last writes in).
    return {
        "sagas_at_once": size,
        "bursts": bursts,
        "samples": len(latencies),
        "abort_to_first_call_p50_ms": round(percentile(latencies, 0.5) * 1000, 1),
        "abort_to_first_call_p99_ms": round(percentile(latencies, 0.99) * 1000, 1),
        "abort_to_first_call_max_ms": round(max(latencies) * 1000, 1),
        "driver_cpu_ms_per_saga": round(cpu[0] * 1000 / total, 1),
        "control_plane_cpu_ms_per_saga": round(cpu[1] * 1000 / total, 1),
        **({"python_calls_per_saga": {k: round(v / total) for k, v in calls.items()}} if calls else {}),
    }


BURST_COLUMNS = [
    "sagas aborted together, on an idle controller",
    "controller",
    "samples",
    "abort->1st call p50",
    "p99",
    "slowest",
    "controller CPU per saga",
    "apiserver+etcd CPU per saga",
]


def burst_cells(who: str, r: dict[str, Any]) -> tuple[Any, ...]:
    """One burst_latency result as a row under BURST_COLUMNS."""
    return (
        r["sagas_at_once"],
        who,
        r["samples"],
        f"{r['abort_to_first_call_p50_ms']} ms",
        f"{r['abort_to_first_call_p99_ms']} ms",
        f"{r['abort_to_first_call_max_ms']} ms",
        f"{r['driver_cpu_ms_per_saga']} ms",
        f"{r['control_plane_cpu_ms_per_saga']} ms",
    )


async def rounds_of_ten(bench: Bench, rounds: int, bursts: int, profile: Path | None) -> None:
    """The bursts of ten by the operator, the Go floor and the floor's requests from Python, one
    after the other, `rounds` times on one control plane: the ratios of one round, round after round."""
    controllers: tuple[tuple[str, Floor | None], ...] = (
        ("UndoLog", None),
        ("floor", "go"),
        ("floor's requests from Python", "python"),
    )
    rows: list[dict[str, Any]] = []
    for number in range(1, rounds + 1):
        for who, floor in controllers:
            named = {None: "operator", "python": "python-floor"}.get(floor)
            stacks = profile / f"{named}-bursts-of-10-round-{number}.txt" if profile and named else None
            measured = await burst_latency(bench, 10, bursts, floor=floor, profile=stacks)
            rows.append({"round": number, "controller": who, **measured})
    print_table(["round", *BURST_COLUMNS], ((r["round"], *burst_cells(r["controller"], r)) for r in rows))
    counted_rows = [r for r in rows if "python_calls_per_saga" in r]
    if counted_rows:
        print_calls(counted_rows)
    save("compensation_rounds", rows)


def print_calls(rows: list[dict[str, Any]]) -> None:
    """Python function calls per compensated saga, by package, each counted controller a column."""
    packages = Counter[str]()
    for r in rows:
        packages.update(r["python_calls_per_saga"])
    columns = [f"{r['controller']}, round {r['round']}" for r in rows]
    table = [
        (package, *(r["python_calls_per_saga"].get(package, 0) for r in rows)) for package, _ in packages.most_common()
    ]
    table.append(("all", *(sum(r["python_calls_per_saga"].values()) for r in rows)))
    print_table(["Python function calls per saga", *columns], table)


async def main(
    sizes: list[int], idle_samples: int, bursts_of_10: int, rounds: int, profile: Path | None, count_calls: Path | None
) -> None:
    if count_calls is not None:  # the operators and Python floors started from now on count their calls
        os.environ.update(environment(count_calls))
    rows = []
    async with bench_cluster() as bench:
        if rounds:
            await rounds_of_ten(bench, rounds, bursts_of_10, profile)
        if idle_samples:
            idle = await burst_latency(bench, 1, idle_samples)
            ten = await burst_latency(bench, 10, bursts_of_10) if bursts_of_10 else None
            floor_idle = await burst_latency(bench, 1, idle_samples, floor="go")
            floor_ten = await burst_latency(bench, 10, bursts_of_10, floor="go") if bursts_of_10 else None
            # The same bursts from Python with no logic: the language's and aiohttp's share of the CPU.
            python_ten = await burst_latency(bench, 10, bursts_of_10, floor="python") if bursts_of_10 else None
            print_table(
                BURST_COLUMNS,
                [
                    burst_cells(who, r)
                    for who, r in (
                        ("UndoLog", idle),
                        ("UndoLog", ten),
                        ("floor", floor_idle),
                        ("floor", floor_ten),
                        ("floor's requests from Python", python_ten),
                    )
                    if r is not None
                ],
            )
            floors = {"floor": {**floor_idle, "bursts_of_10": floor_ten}, "python_floor": {"bursts_of_10": python_ten}}
            save("compensation_idle", {**idle, "bursts_of_10": ten, **floors})
        for n in sizes:
            print(f"N={n} ...", flush=True)
            row = await measure(bench, n, profile)
            print(json.dumps(row), flush=True)
            rows.append(row)
    if not rows:  # no sizes asked: the last run's figures stay
        return
    print_table(
        [
            "sagas",
            "compensations",
            "abort->1st call p50",
            "p99",
            "compensations/s",
            "writes/saga",
            "raw writes/s",
            "operator / ceiling",
            "operator writes/s",
            "Go ceiling writes/s",
            "fraction",
        ],
        (
            (
                r["sagas"],
                r["compensations"],
                f"{r['abort_to_first_call_p50_ms']} ms",
                f"{r['abort_to_first_call_p99_ms']} ms",
                r["compensations_per_second"],
                r["api_writes_per_saga"],
                r["raw_writes_per_second"],
                f"{r['operator_vs_ceiling']}x",
                r["operator_writes_per_second"],
                r["go_ceiling_writes_per_second"],
                r["fraction_of_go_ceiling"],
            )
            for r in rows
        ),
    )
    save("compensation", rows)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="*", default=[1, 10, 100, 1000])
    parser.add_argument(
        "--idle-samples",
        type=int,
        default=100,
        help="one-saga-at-a-time aborts for p50/p99 (of 30, the p99 was the slowest sample)",
    )
    parser.add_argument(
        "--bursts-of-10",
        type=int,
        default=10,
        help="bursts of 10 sagas aborted together, for the 10-at-once p50/p99 (of 50 samples, the p99 was the slowest)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=0,
        help="first, rounds of the bursts of ten: the operator, the Go floor, the floor's requests from Python",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        help="py-spy the operator and the Python floor during each run; stacks in this folder",
    )
    parser.add_argument(
        "--count-calls",
        type=Path,
        help="count the Python function calls per saga of the operator and the Python floor in the bursts of ten, "
        "by package (cProfile's counts, written to this folder; the CPU figures of such a run are inflated)",
    )
    options = parser.parse_args()
    asyncio.run(
        main(
            options.sizes,
            options.idle_samples,
            options.bursts_of_10,
            options.rounds,
            options.profile,
            options.count_calls,
        )
    )
