"""The archive against the compensation it follows, in one run: N sagas of 3 entries aborted
while the operator is down, then an operator archiving to a real PostgreSQL server (fsync on,
like etcd) resumes them: how fast they are compensated, and how fast they are archived (counted
from the operator's start, as compensation is). Then the archive emptied and the operator started
again: the backlog of N finished sagas archived from the API alone (each saga and its entries
read), what an archive enabled on a full cluster, or back after an outage, drains at. Last, N
more sagas compensated while PostgreSQL is killed (SIGKILL): the seconds from its return to
every one archived (the drain after an outage).

    python -m bench.archive --sagas 1000
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
from devtools.postgres import LocalPostgres
from rich.progress import Progress
from tests.support.manifests import webhook
from tests.support.operator_process import OperatorProcess

from bench.harness import Bench, RemoteParticipant, bench_cluster, print_table, save
from bench.scale import populate
from undolog import errors
from undolog.controller.leadership import LeaseSettings


def archived(postgres: LocalPostgres) -> int:
    with psycopg.connect(postgres.dsn) as connection:
        try:
            found = connection.execute("SELECT count(*) FROM undolog_sagas").fetchone()
        except psycopg.errors.UndefinedTable:  # the operator has not applied its migrations yet
            return 0
        return int(found[0]) if found else 0


async def reached(probe: Any) -> int:
    """What `probe()` counts now; -1 when the API could not answer (a loaded apiserver answers a
    LIST 504 while its cache is behind etcd: the next poll asks again)."""
    try:
        return int(await probe())
    except errors.Unavailable:
        return -1


async def until(probe: Any, target: int, within: float) -> float:
    """Seconds until `probe()` reaches `target` (polled every 0.1 s)."""
    began = time.monotonic()
    while (await reached(probe)) < target:
        if time.monotonic() - began > within:
            raise RuntimeError(f"not reached in {within:.0f} s")
        await asyncio.sleep(0.1)
    return time.monotonic() - began


async def compensated_in(bench: Bench, namespace: str) -> int:
    items = await bench.kube.list("sagas", namespace)
    return sum(1 for s in items if s.get("status", {}).get("phase") == "Compensated")


def archiving(bench: Bench, namespace: str, postgres: LocalPostgres) -> OperatorProcess:
    process = OperatorProcess(
        bench.kubeconfig,
        namespace,
        bench.work / "logs",
        extra_args=(f"--archive-dsn={postgres.dsn}",),
        lease_seconds=LeaseSettings(namespace).lease_seconds,
    )
    process.start()
    return process


async def measure(bench: Bench, postgres: LocalPostgres, n: int) -> dict[str, Any]:
    namespace = await bench.namespace("archive")
    participant = RemoteParticipant()
    try:
        await bench.kube.create("webhooks", namespace, webhook("undo", url=participant.url("/undo")))
        with Progress() as progress:
            await populate(bench, namespace, n, progress)

        compensated = functools.partial(compensated_in, bench, namespace)

        async def in_archive() -> int:
            return await asyncio.to_thread(archived, postgres)

        operator = archiving(bench, namespace, postgres)
        began = time.monotonic()
        try:
            compensating = asyncio.ensure_future(until(compensated, n, 1800))
            archive_seconds = await until(in_archive, n, 1800)
            compensation_seconds = await compensating
        finally:
            operator.stop()
        started = time.monotonic() - began
        with psycopg.connect(postgres.dsn) as connection:
            connection.execute("TRUNCATE undolog_sagas, undolog_events")
        operator = archiving(bench, namespace, postgres)
        try:
            backlog_seconds = await until(in_archive, n, 1800)
        finally:
            operator.stop()
    finally:
        participant.close()
    drain = await drain_after_outage(bench, postgres, n)
    return {
        "sagas": n,
        "archive_drain_after_outage_seconds": round(drain, 2),
        "compensated_sagas_per_s": round(n / compensation_seconds, 1),
        "archive_sagas_per_s": round(n / archive_seconds, 1),
        "archive_backlog_sagas_per_s": round(n / backlog_seconds, 1),
        "first_run_seconds": round(started, 1),
    }


async def drain_after_outage(bench: Bench, postgres: LocalPostgres, n: int) -> float:
    """N sagas compensated while PostgreSQL is killed; seconds from its return to all archived."""
    namespace = await bench.namespace("archive-outage")
    participant = RemoteParticipant()
    try:
        await bench.kube.create("webhooks", namespace, webhook("undo", url=participant.url("/undo")))
        with Progress() as progress:
            await populate(bench, namespace, n, progress)
        before = await asyncio.to_thread(archived, postgres)
        postgres.kill()
        operator = archiving(bench, namespace, postgres)
        try:
            await until(functools.partial(compensated_in, bench, namespace), n, 1800)
            postgres.start()
            return await until(lambda: asyncio.to_thread(archived, postgres), before + n, 1800)
        finally:
            operator.stop()
    finally:
        participant.close()


async def main(n: int) -> None:
    with tempfile.TemporaryDirectory(prefix="undolog-bench-postgres-") as folder:
        postgres = LocalPostgres(Path(folder)).up()
        try:
            async with bench_cluster() as bench:
                result = await measure(bench, postgres, n)
        finally:
            postgres.down()
    print_table(
        [
            "sagas (3 entries)",
            "compensated / s",
            "archived / s (same run)",
            "backlog archived / s (from the API)",
            "drained after an outage (s)",
        ],
        [
            [
                n,
                result["compensated_sagas_per_s"],
                result["archive_sagas_per_s"],
                result["archive_backlog_sagas_per_s"],
                result["archive_drain_after_outage_seconds"],
            ]
        ],
    )
    save("archive", result)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sagas", type=int, default=1000)
    asyncio.run(main(parser.parse_args().sagas))
