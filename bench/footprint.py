"""What a finished saga leaves in etcd: N sagas of 3 steps written by agents through the SDK, half
committed and half aborted (compensated by the operator), then etcd compacted and defragmented:
bytes in use per finished saga, and the JSON the API stores for each (with its entries), and how
much of it is managedFields. With --flat-minutes, sagas at a steady rate under a short TTL: etcd's
size printed every minute, to see it stay flat.

    python -m bench.footprint --sagas 400
    python -m bench.footprint --sagas 0 --flat-minutes 30 --rate 40 --ttl 300
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

import httpx
from tests.support.manifests import webhook

from bench.compensation import bounded
from bench.harness import Bench, RemoteParticipant, bench_cluster, print_table, save
from undolog import errors
from undolog.kube import Kube
from undolog.sdk import Call, open_saga

STEPS = 3
IN_FLIGHT = 400  # agents at once in the flat run
PATH = "/apis/undolog.io/v1beta1"


class Etcd:
    """etcd's own maintenance API over its HTTP gateway (what etcdctl does, with no binary)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def status(self) -> dict[str, Any]:
        return dict(httpx.post(f"{self.url}/v3/maintenance/status", json={}, timeout=30).json())

    def in_use(self) -> int:
        """Bytes in use after compacting every old revision away and defragmenting."""
        revision = int(self.status()["header"]["revision"])
        httpx.post(f"{self.url}/v3/kv/compaction", json={"revision": revision, "physical": True}, timeout=120)
        httpx.post(f"{self.url}/v3/maintenance/defragment", json={}, timeout=300)
        return int(self.status()["dbSizeInUse"])

    def size(self) -> tuple[int, int]:
        status = self.status()
        return int(status["dbSize"]), int(status.get("dbSizeInUse", 0))


async def agent(kube: Kube, namespace: str, index: int, commit: bool, ttl: int | None = None) -> str:
    """One agent's saga of STEPS steps through the SDK: committed, or aborted after its last."""
    run = await open_saga(name=f"f-{index:06d}", namespace=namespace, kube=kube, ttl_seconds_after_finished=ttl)
    try:
        async with run:
            for step in range(1, STEPS + 1):
                undo = Call(function="undo", args={"user_id": f"u-{index}", "step": step})
                async with run.step(f"step-{step}", compensation=undo) as made:
                    made.output = {"id": f"{index}-{step}", "created": True}
            if not commit:
                raise RuntimeError("the agent gave up")
    except RuntimeError:
        pass
    return run.name


async def stored_json(bench: Bench, namespace: str) -> tuple[float, float]:
    """Mean JSON bytes the API stores per saga with its entries, and of that managedFields."""
    path = f"{PATH}/namespaces/{namespace}"
    sagas = (await bench.kube.request("GET", f"{path}/sagas"))["items"]
    entries = (await bench.kube.request("GET", f"{path}/undoentries"))["items"]
    whole = sum(len(json.dumps(o, separators=(",", ":"))) for o in (*sagas, *entries))
    managed = sum(
        len(json.dumps(o["metadata"].get("managedFields", []), separators=(",", ":"))) for o in (*sagas, *entries)
    )
    return whole / len(sagas), managed / len(sagas)


async def finished(bench: Bench, namespace: str, n: int) -> bool:
    items = await bench.kube.list("sagas", namespace)
    return sum(1 for s in items if s.get("status", {}).get("phase") in ("Completed", "Compensated")) == n and all(
        not s["metadata"].get("finalizers") for s in items
    )


async def footprint(bench: Bench, etcd: Etcd, n: int) -> dict[str, Any]:
    namespace = await bench.namespace("footprint")
    participant = RemoteParticipant()
    operator = bench.operator(namespace)
    try:
        await bench.kube.create("webhooks", namespace, webhook("undo", url=participant.url("/undo")))
        before = etcd.in_use()
        await bounded((lambda i=i: agent(bench.kube, namespace, i, i % 2 == 0) for i in range(n)), limit=20)  # type: ignore[misc]
        deadline = time.monotonic() + 600
        while not await finished(bench, namespace, n):
            if time.monotonic() > deadline:
                raise RuntimeError("the sagas did not all finish in 10 minutes")
            await asyncio.sleep(1)
        with_events = etcd.in_use()
        # Events expire after an hour (--event-ttl): what stays is the sagas and their entries.
        await bench.kube.request("DELETE", f"/api/v1/namespaces/{namespace}/events")
        after = etcd.in_use()
        json_bytes, managed = await stored_json(bench, namespace)
    finally:
        operator.stop()
        participant.close()
    return {
        "sagas": n,
        "etcd_bytes_per_finished_saga": round((after - before) / n),
        "etcd_bytes_per_finished_saga_with_its_events": round((with_events - before) / n),
        "json_bytes_per_finished_saga": round(json_bytes),
        "managed_fields_bytes_per_finished_saga": round(managed),
    }


async def count(bench: Bench, path: str) -> int:
    """Objects at a collection path, from one item and the API's remaining count (no whole listing)."""
    page = await bench.kube.request("GET", path, params={"limit": "1"})
    return len(page["items"]) + int(page["metadata"].get("remainingItemCount") or 0)


async def sample(bench: Bench, etcd: Etcd, namespace: str, began: float, sizes: list[dict[str, Any]]) -> None:
    """etcd's size and the sagas held, printed; a probe that fails is printed, never the end of the run."""
    minute = round((time.monotonic() - began) / 60, 1)
    try:
        size, in_use = await asyncio.to_thread(etcd.size)
        live = await count(bench, f"{PATH}/namespaces/{namespace}/sagas")
        events = await count(bench, f"/api/v1/namespaces/{namespace}/events")
    except (httpx.HTTPError, errors.KubeError) as failed:
        print(f"minute {minute:5.1f}: not read ({failed})")
        return
    sizes.append({"minute": minute, "db": size, "in_use": in_use, "sagas": live, "events": events})
    print(
        f"minute {minute:5.1f}: etcd {size / 2**20:7.1f} MiB ({in_use / 2**20:7.1f} in use), {live} sagas,"
        f" {events} Events (kept an hour)"
    )


async def flat(bench: Bench, etcd: Etcd, minutes: float, rate: float, ttl: int) -> dict[str, Any]:
    """Sagas at `rate` a second for `minutes` under a TTL of `ttl` s: etcd's size each minute. At
    most IN_FLIGHT agents at once: a box that cannot keep up shows a lower rate, not a pile-up."""
    namespace = await bench.namespace("flat")
    participant = RemoteParticipant()
    operator = bench.operator(namespace)  # the saga's own TTL: the operator's defaults stay as installed
    sizes: list[dict[str, Any]] = []
    failed: list[str] = []
    began = time.monotonic()
    try:
        await bench.kube.create("webhooks", namespace, webhook("undo", url=participant.url("/undo")))
        room = asyncio.Semaphore(IN_FLIGHT)
        running: set[asyncio.Task[None]] = set()

        async def one(index: int) -> None:
            try:
                await agent(bench.kube, namespace, index, index % 2 == 0, ttl)
            except errors.KubeError as error:
                failed.append(error.message)
            finally:
                room.release()

        index, next_minute = 0, began
        while time.monotonic() - began < minutes * 60:
            if time.monotonic() >= next_minute:
                await sample(bench, etcd, namespace, began, sizes)
                next_minute += 60
            await room.acquire()
            task = asyncio.create_task(one(index))
            running.add(task)
            task.add_done_callback(running.discard)
            index += 1
            await asyncio.sleep(max(began + index / rate - time.monotonic(), 0))
        elapsed = time.monotonic() - began
        await asyncio.gather(*running)
        await sample(bench, etcd, namespace, began, sizes)
    finally:
        operator.stop()
        participant.close()
    return {
        "rate_asked": rate,
        "rate_reached": round(index / elapsed, 1),
        "ttl_seconds": ttl,
        "minutes": minutes,
        "sagas": index,
        "agents_failed": len(failed),
        "first_failures": failed[:5],
        "sizes": sizes,
    }


async def main(n: int, flat_minutes: float, rate: float, ttl: int) -> None:
    async with bench_cluster() as bench:
        assert bench.local is not None, "the footprint is read from the local control plane's etcd"
        etcd = Etcd(bench.local.etcd_url)
        results: dict[str, Any] = {}
        if n:
            results["footprint"] = measured = await footprint(bench, etcd, n)
            print_table(
                [
                    "finished sagas",
                    "etcd bytes each (compacted, defragmented)",
                    "with its Events (kept an hour)",
                    "JSON bytes each",
                    "of it managedFields",
                ],
                [
                    [
                        n,
                        measured["etcd_bytes_per_finished_saga"],
                        measured["etcd_bytes_per_finished_saga_with_its_events"],
                        measured["json_bytes_per_finished_saga"],
                        measured["managed_fields_bytes_per_finished_saga"],
                    ]
                ],
            )
        if flat_minutes:
            steady = await flat(bench, etcd, flat_minutes, rate, ttl)
            save("footprint_flat", steady)  # apart: the summary reads the footprint of N sagas
            sizes = steady["sizes"]
            print_table(
                ["sagas/s asked", "reached", "TTL s", "minutes", "agents failed", "etcd MiB: first, max, last"],
                [
                    [
                        rate,
                        steady["rate_reached"],
                        ttl,
                        flat_minutes,
                        steady["agents_failed"],
                        ", ".join(
                            f"{v / 2**20:.1f}" for v in (sizes[0]["db"], max(x["db"] for x in sizes), sizes[-1]["db"])
                        ),
                    ]
                ],
            )
        if results:
            save("footprint", results)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sagas", type=int, default=400)
    parser.add_argument("--flat-minutes", type=float, default=0)
    parser.add_argument("--rate", type=float, default=40)
    parser.add_argument("--ttl", type=int, default=300, help="seconds after a saga finishes that it is deleted")
    arguments = parser.parse_args()
    asyncio.run(main(arguments.sagas, arguments.flat_minutes, arguments.rate, arguments.ttl))
