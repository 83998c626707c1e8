"""UndoLog's best-known peer on the same workloads and participant: Temporal. Its dev server is
built from source by `make bench` (`bin/temporal`, CLI v1.5.1, Server 1.29.1) and runs on a
SQLite file (durable: not `:memory:`); the saga is bench/temporal_saga.py, run by a worker in its
own process with Temporal's Python SDK. Measured as bench.forward and bench.compensation
measure UndoLog: a 3-step saga one at a time and 100 at once; an abort (a signal after the
last step) to the first compensation call, for one idle saga, 10 and 100 at once.

    python -m bench.temporal
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

from devtools.control_plane.local import free_port
from temporalio.client import Client, WorkflowHandle

from bench.compensation import percentile
from bench.harness import BIN, ROOT, RemoteParticipant, print_table, save
from bench.temporal_saga import TASK_QUEUE, SagaInput, ThreeStepSaga


@contextmanager
def dev_server(scratch: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """The dev server on a SQLite file in `scratch`: its address."""
    port = free_port()
    server = subprocess.Popen(
        [
            str(BIN / "temporal"),
            "server",
            "start-dev",
            "--headless",
            "--ip=127.0.0.1",
            f"--port={port}",
            f"--http-port={free_port()}",
            f"--metrics-port={free_port()}",
            f"--db-filename={scratch / 'temporal.db'}",
            "--log-level=error",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield f"127.0.0.1:{port}", server
    finally:
        server.terminate()
        server.wait(timeout=30)


@contextmanager
def worker(address: str) -> Iterator[None]:
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.temporal_saga", address], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        process.stdout.readline()  # "worker ready"
        yield
    finally:
        process.terminate()
        process.wait(timeout=30)


@asynccontextmanager
async def temporal() -> AsyncIterator[Client]:
    """The dev server and a worker process; a client of both."""
    with (
        tempfile.TemporaryDirectory(prefix="undolog-temporal-") as scratch,
        dev_server(Path(scratch)) as (
            address,
            server,
        ),
    ):
        client = await connected(address, server)
        with worker(address):
            yield client


async def connected(address: str, server: subprocess.Popen[bytes]) -> Client:
    deadline = time.monotonic() + 60
    while True:
        try:
            return await Client.connect(address)
        except RuntimeError:
            if server.poll() is not None or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def begin(client: Client, participant: RemoteParticipant, saga: str, wait: bool) -> WorkflowHandle[Any, Any]:
    return await client.start_workflow(
        ThreeStepSaga.run,
        SagaInput(participant.url(""), saga, wait),
        id=saga,
        task_queue=TASK_QUEUE,
    )


async def forward(client: Client, participant: RemoteParticipant, concurrent: int, rounds: int) -> dict[str, Any]:
    """3-step sagas, `concurrent` at a time: wall time from start to result, and sagas/s."""
    walls: list[float] = []

    async def one() -> None:
        began = time.monotonic()
        handle = await begin(client, participant, f"fwd-{uuid.uuid4().hex[:10]}", wait=False)
        assert await handle.result() == "Completed"
        walls.append(time.monotonic() - began)

    began = time.monotonic()
    for _ in range(rounds):
        await asyncio.gather(*(one() for _ in range(concurrent)))
    span = time.monotonic() - began
    return {
        "concurrent_sagas": concurrent,
        "sagas": concurrent * rounds,
        "saga_wall_p50_ms": round(percentile(walls, 0.5) * 1000, 1),
        "sagas_per_second": round(concurrent * rounds / span, 1),
    }


async def aborted(client: Client, participant: RemoteParticipant, n: int) -> dict[str, Any]:
    """n sagas run their 3 steps and wait; all are aborted together: signal to first undo call."""
    names = [f"abort-{uuid.uuid4().hex[:10]}" for _ in range(n)]
    handles = await asyncio.gather(*(begin(client, participant, name, wait=True) for name in names))
    expected = {name for name in names}
    await participant.until(
        lambda received: sum(1 for r in received if r.path == "/step" and r.body["saga"] in expected) >= 3 * n, 300
    )
    signalled: dict[str, float] = {}

    async def abort(handle: WorkflowHandle[Any, Any], name: str) -> None:
        await handle.signal(ThreeStepSaga.abort)
        signalled[name] = time.monotonic()

    first_signal = time.monotonic()
    await asyncio.gather(*(abort(h, name) for h, name in zip(handles, names, strict=True)))
    received = await participant.until(
        lambda received: sum(1 for r in received if r.path == "/undo" and r.body["saga"] in expected) >= 3 * n, 300
    )
    assert all(r == "Compensated" for r in await asyncio.gather(*(h.result() for h in handles)))
    undone = sorted((r for r in received if r.path == "/undo" and r.body["saga"] in expected), key=lambda r: r.at)
    first: dict[str, float] = {}
    for request in undone:
        first.setdefault(request.body["saga"], request.at)
    latencies = [first[name] - signalled[name] for name in names]
    order = {name: [r.body["n"] for r in undone if r.body["saga"] == name] for name in names}
    assert all(o == [3, 2, 1] for o in order.values())
    return {
        "sagas": n,
        "abort_to_first_call_p50_ms": round(percentile(latencies, 0.5) * 1000, 1),
        "abort_to_first_call_p99_ms": round(percentile(latencies, 0.99) * 1000, 1),
        "compensations_per_second": round(3 * n / (undone[-1].at - first_signal), 1),
    }


async def idle(client: Client, participant: RemoteParticipant, samples: int) -> dict[str, Any]:
    """One saga at a time, as bench.compensation's idle figure."""
    latencies = []
    for _ in range(samples):
        await asyncio.sleep(0.3)  # idle: nothing else in flight (a pause, not a wait)
        row = await aborted(client, participant, 1)
        latencies.append(row["abort_to_first_call_p50_ms"])
    return {
        "samples": samples,
        "abort_to_first_call_p50_ms": round(percentile(latencies, 0.5), 1),
        "abort_to_first_call_p99_ms": round(percentile(latencies, 0.99), 1),
        "abort_to_first_call_max_ms": round(max(latencies), 1),
    }


async def main(idle_samples: int, sizes: list[int]) -> None:
    participant = RemoteParticipant()
    try:
        async with temporal() as client:
            await forward(client, participant, 1, 3)  # warm: the first workflow loads the sandbox
            results: dict[str, Any] = {
                "forward": [await forward(client, participant, 1, 30), await forward(client, participant, 100, 1)],
                "idle": await idle(client, participant, idle_samples),
                "aborted": [await aborted(client, participant, n) for n in sizes],
            }
    finally:
        participant.close()
    print("\nTemporal (dev server 1.29.1 on a SQLite file, Python SDK), same participant")
    print_table(
        ledger="Temporal's dev server: its SQLite file, as `temporal server start-dev --db-filename` keeps it",
        headers=["workload", "p50", "p99", "throughput"],
        rows=[
            *(
                (
                    f"forward, 3 steps, {r['concurrent_sagas']} at once",
                    f"{r['saga_wall_p50_ms']} ms",
                    "",
                    f"{r['sagas_per_second']} sagas/s",
                )
                for r in results["forward"]
            ),
            (
                "abort -> 1st compensation, one idle saga",
                f"{results['idle']['abort_to_first_call_p50_ms']} ms",
                f"{results['idle']['abort_to_first_call_p99_ms']} ms",
                "",
            ),
            *(
                (
                    f"abort -> 1st compensation, {r['sagas']} at once",
                    f"{r['abort_to_first_call_p50_ms']} ms",
                    f"{r['abort_to_first_call_p99_ms']} ms",
                    f"{r['compensations_per_second']} compensations/s",
                )
                for r in results["aborted"]
            ),
        ],
    )
    save("temporal", results)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--idle-samples", type=int, default=100)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 100])
    arguments = parser.parse_args()
    asyncio.run(main(arguments.idle_samples, arguments.sizes))
