"""What `undolog mcp` adds to a tool call: N mapped calls (the tracker's create_issue, undone by
close_issue) through the gateway, each beside the same call made directly to the tracker, one
after the other in the same run, so both meet the same box; first on today's stateless revision
(2026-07-28: the `mcp` package's Client with its defaults, the saga handle passed back, each
call resuming the saga from the ledger), then on the session era (2025-11-25). Reported: p50
and p99 of each, what the gateway adds (the difference), and the API writes per call (the
apiserver's own counts). The first calls, which open the saga, are left out, as is the
client's handshake; a read-only tool (passed through, nothing written) shows the hop alone.

    python -m bench.gateway --calls 200
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable
from typing import Any, Literal

from mcp import Client
from tests.support.gateway_process import GatewayProcess, gateway_config
from tests.support.mcp_tracker import Tracker

from bench.compensation import percentile
from bench.harness import bench_cluster, delta, print_table, save


async def timed(call: Awaitable[Any]) -> float:
    """The call's milliseconds: the coroutine is made before the clock starts and awaited after."""
    began = time.perf_counter()
    result = await call
    if result.is_error:
        raise RuntimeError(f"the tool call failed: {result.content}")
    return (time.perf_counter() - began) * 1000


def figures(samples: list[float]) -> dict[str, float]:
    return {"p50_ms": round(percentile(samples, 0.5), 2), "p99_ms": round(percentile(samples, 0.99), 2)}


def difference(through: list[float], direct: list[float]) -> dict[str, float]:
    return {k: round(figures(through)[k] - figures(direct)[k], 2) for k in ("p50_ms", "p99_ms")}


HANDLE = "undolog_saga"


async def era(
    bench: Any, gateway: GatewayProcess, tracker: Tracker, calls: int, mode: Literal["auto", "legacy"]
) -> dict[str, Any]:
    """The figures of one protocol era: `auto` is today's stateless revision (the saga handle
    passed back), `legacy` the session's."""
    async with Client(tracker.url, mode=mode) as upstream, Client(gateway.url, mode=mode) as agent:
        direct, through, read_direct, read_through = [], [], [], []
        handle: dict[str, str] = {}
        for title in ("warm", "up"):  # the saga is opened by the first mapped call
            await upstream.call_tool("create_issue", {"title": title})
            opened = await agent.call_tool("create_issue", {"title": title} | handle)
            if mode == "auto":
                handle = {HANDLE: str((opened.meta or {})["io.undolog/saga-handle"])}
        before = await bench.writes()
        for n in range(calls):
            direct.append(await timed(upstream.call_tool("create_issue", {"title": f"d{n}"})))
            through.append(await timed(agent.call_tool("create_issue", {"title": f"g{n}"} | handle)))
        writes = delta(await bench.writes(), before)
        for _ in range(calls):  # a read-only tool passes straight through: the hop alone
            read_direct.append(await timed(upstream.call_tool("list_issues", {})))
            read_through.append(await timed(agent.call_tool("list_issues", {})))
        await agent.call_tool("undolog_commit", handle)
    return {
        "direct": figures(direct),
        "through_gateway": figures(through),
        "added": difference(through, direct),
        "read_only_added": difference(read_through, read_direct),
        "api_writes": writes,
        "entry_writes_per_call": round(writes.get("undoentries", 0) / calls, 2),
        "saga_writes_per_call": round(writes.get("sagas", 0) / calls, 2),
    }


async def measure(calls: int) -> dict[str, Any]:
    tracker = Tracker()
    try:
        async with bench_cluster() as bench:
            namespace = await bench.namespace("gateway")
            gateway = GatewayProcess(bench.kubeconfig, gateway_config(namespace, tracker), bench.work)
            try:
                stateless = await era(bench, gateway, tracker, calls, "auto")
                session = await era(bench, gateway, tracker, calls, "legacy")
            finally:
                gateway.stop()
    finally:
        tracker.stop()
    return {"calls": calls, **stateless, "session": session}


def ms(figure: dict[str, float]) -> list[str]:
    return [f"{figure['p50_ms']} ms", f"{figure['p99_ms']} ms"]


def rows(calls: int, era: str, result: dict[str, Any]) -> list[list[Any]]:
    writes = [result["entry_writes_per_call"], result["saga_writes_per_call"]]
    return [
        [calls, era, "direct to the tracker", *ms(result["direct"]), "-", "-"],
        [calls, era, "through undolog mcp", *ms(result["through_gateway"]), *writes],
        [calls, era, "added by the gateway", *ms(result["added"]), "", ""],
        [calls, era, "added to a read-only call (passed through)", *ms(result["read_only_added"]), 0, 0],
    ]


def main(calls: int) -> None:
    result = asyncio.run(measure(calls))
    print_table(
        ["tool calls", "protocol", "", "p50", "p99", "entry writes/call", "saga writes/call"],
        rows(calls, "2026-07-28 (handle)", result) + rows(calls, "2025-11-25 (session)", result["session"]),
    )
    save("gateway", result)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200)
    main(parser.parse_args().calls)
