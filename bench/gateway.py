"""What `undolog mcp` adds to a tool call: N mapped calls (the tracker's create_issue, undone by
close_issue) through the gateway, each beside the same call made directly to the tracker, one
after the other in the same run, so both meet the same box; first on today's stateless revision
(2026-07-28: the `mcp` package's Client with its defaults, the saga handle passed back, each
call resuming the saga from the ledger), then on the session era (2025-11-25). Reported: p50
and p99 of each, what the gateway adds (the difference), and the API writes per call (the
apiserver's own counts). The first calls, which open the saga, are left out, as is the
client's handshake; a read-only tool (passed through, nothing written) shows the hop alone.
The same rounds also make, with the SDK and no gateway, the two durable writes a mapped call
costs the ledger (its UndoEntry registered, then its outcome): the part of the gateway's hop no
gateway with a ledger can avoid, measured alone.

On the stateless revision each round also calls a second gateway that requires a token, with a
ServiceAccount token (TokenRequest; checked by TokenReview, kept 10 s) and with a JWT of Ory
Hydra (bin/hydra; its keys fetched once, a verification kept 60 s), each agent presenting one
token throughout as agents do: what authentication adds is the difference to the gateway
without it, in the same rounds.

    python -m bench.gateway --calls 200
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, Literal

import httpx2
from devtools.control_plane.local import free_port
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from tests.cluster.test_mcp_auth import service_account_token
from tests.support.gateway_process import GatewayProcess, gateway_config
from tests.support.hydra import Hydra
from tests.support.mcp_tracker import Tracker

from bench.compensation import percentile
from bench.harness import bench_cluster, delta, print_table, save
from undolog.api import Call
from undolog.sdk import SagaRun, open_saga


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


def bearing(url: str, token: str | None) -> Client:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    return Client(streamable_http_client(url, http_client=httpx2.AsyncClient(headers=headers, timeout=60)))


async def routes(bench: Any, namespace: str, tracker: Tracker, calls: int, agents: dict[str, Client]) -> dict[str, Any]:
    """Stateless calls, round after round: directly, then through each agent's gateway; each
    agent's saga opened first (left out). Per route: mapped and read-only p50 and p99."""
    mapped: dict[str, list[float]] = {"direct": [], "ledger": [], **{name: [] for name in agents}}
    read: dict[str, list[float]] = {"direct": [], **{name: [] for name in agents}}
    ledger = await open_saga(generate_name="bench-ledger-", namespace=namespace, kube=bench.kube)
    async with Client(tracker.url) as upstream:
        handles = {}
        for name, agent in agents.items():
            opened = await agent.call_tool("create_issue", {"title": f"open {name}"})
            handles[name] = {HANDLE: str((opened.meta or {})["io.undolog/saga-handle"])}
        before = await bench.writes()
        for n in range(calls):
            mapped["direct"].append(await timed(upstream.call_tool("create_issue", {"title": f"d{n}"})))
            for name, agent in agents.items():
                mapped[name].append(
                    await timed(agent.call_tool("create_issue", {"title": f"{name}{n}"} | handles[name]))
                )
            mapped["ledger"].append(await two_writes(ledger, n))
        writes = delta(await bench.writes(), before)
        for agent in (upstream, *agents.values()):  # the first read of each makes its connection
            await agent.call_tool("list_issues", {})
        for _ in range(calls):
            read["direct"].append(await timed(upstream.call_tool("list_issues", {})))
            for name, agent in agents.items():
                read[name].append(await timed(agent.call_tool("list_issues", {})))
        for name, agent in agents.items():
            await agent.call_tool("undolog_commit", handles[name])
    await ledger.commit()
    return {"mapped": mapped, "read": read, "writes": writes}


async def two_writes(run: SagaRun, n: int) -> float:
    """The milliseconds of what a mapped call writes to the ledger: its UndoEntry registered
    with its compensation, then its outcome recorded."""
    began = time.perf_counter()
    step = await run.register(f"create-issue-{n}", Call(function="tracker.close-issue", args={"number": n}))
    step.output = {"number": n}
    await run.finish(step)
    return (time.perf_counter() - began) * 1000


async def measure(calls: int) -> dict[str, Any]:
    tracker = Tracker()
    hydra = Hydra(Path(tempfile.mkdtemp(prefix="undolog-bench-hydra-")))
    try:
        async with bench_cluster() as bench:
            namespace = await bench.namespace("gateway")
            port = free_port()
            resource = f"http://127.0.0.1:{port}/mcp"
            auth = {"resource": resource, "issuers": [{"issuer": hydra.issuer}], "serviceAccounts": True}
            await bench.kube.request(
                "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": "agent"}}
            )
            hydra.client("bench-agent", [resource])
            tokens = {
                "service_account": await service_account_token(bench.kube, namespace, "agent", resource),
                "jwt": hydra.token("bench-agent", resource),
            }
            gateway = GatewayProcess(bench.kubeconfig, gateway_config(namespace, tracker), bench.work)
            guarded = GatewayProcess(
                bench.kubeconfig, gateway_config(namespace, tracker, auth=auth), bench.work, port=port
            )
            try:
                async with (
                    bearing(gateway.url, None) as open_agent,
                    bearing(guarded.url, tokens["service_account"]) as account_agent,
                    bearing(guarded.url, tokens["jwt"]) as jwt_agent,
                ):
                    agents = {"open": open_agent, "service_account": account_agent, "jwt": jwt_agent}
                    stateless = await routes(bench, namespace, tracker, calls, agents)
                session = await era(bench, gateway, tracker, calls, "legacy")
            finally:
                gateway.stop()
                guarded.stop()
    finally:
        tracker.stop()
        hydra.stop()
    return {"calls": calls, **summarized(stateless, calls), "session": session}


def summarized(measured: dict[str, Any], calls: int) -> dict[str, Any]:
    """The stateless figures under the keys earlier runs used, and what authentication adds."""
    mapped, read, writes = measured["mapped"], measured["read"], measured["writes"]
    authenticated = {
        kind: {
            "through_gateway": figures(mapped[kind]),
            "added": difference(mapped[kind], mapped["direct"]),
            "auth_added": difference(mapped[kind], mapped["open"]),
            "read_only_auth_added": difference(read[kind], read["open"]),
        }
        for kind in ("service_account", "jwt")
    }
    steps_a_round = 4  # the open agent's, the ServiceAccount's, the JWT's and the ledger's alone each register one
    return {
        "direct": figures(mapped["direct"]),
        "through_gateway": figures(mapped["open"]),
        "added": difference(mapped["open"], mapped["direct"]),
        "ledger_writes": figures(mapped["ledger"]),
        "added_beyond_ledger_writes": {
            k: round(difference(mapped["open"], mapped["direct"])[k] - figures(mapped["ledger"])[k], 2)
            for k in ("p50_ms", "p99_ms")
        },
        "read_only_added": difference(read["open"], read["direct"]),
        "api_writes": writes,
        "entry_writes_per_call": round(writes.get("undoentries", 0) / (calls * steps_a_round), 2),
        "saga_writes_per_call": round(writes.get("sagas", 0) / (calls * steps_a_round), 2),
        "authenticated": authenticated,
    }


def ms(figure: dict[str, float]) -> list[str]:
    return [f"{figure['p50_ms']} ms", f"{figure['p99_ms']} ms"]


def rows(calls: int, era: str, result: dict[str, Any]) -> list[list[Any]]:
    writes = [result["entry_writes_per_call"], result["saga_writes_per_call"]]
    return [
        [calls, era, "direct to the tracker", *ms(result["direct"]), "-", "-"],
        [calls, era, "through undolog mcp", *ms(result["through_gateway"]), *writes],
        [calls, era, "added by the gateway", *ms(result["added"]), "", ""],
        *(
            [[calls, era, "its two ledger writes alone (SDK, no gateway)", *ms(result["ledger_writes"]), 2, 0]]
            if "ledger_writes" in result
            else []
        ),
        [calls, era, "added to a read-only call (passed through)", *ms(result["read_only_added"]), 0, 0],
    ]


def auth_rows(calls: int, result: dict[str, Any]) -> list[list[Any]]:
    said = {"service_account": "a ServiceAccount token", "jwt": "a JWT (Ory Hydra)"}
    found = []
    for kind, figures_of in result["authenticated"].items():
        found += [
            [calls, said[kind], "through undolog mcp", *ms(figures_of["through_gateway"])],
            [calls, said[kind], "added by authentication to a mapped call", *ms(figures_of["auth_added"])],
            [calls, said[kind], "added by authentication to a read-only call", *ms(figures_of["read_only_auth_added"])],
        ]
    return found


def main(calls: int) -> None:
    result = asyncio.run(measure(calls))
    print_table(
        ["tool calls", "protocol", "", "p50", "p99", "entry writes/call", "saga writes/call"],
        rows(calls, "2026-07-28 (handle)", result) + rows(calls, "2025-11-25 (session)", result["session"]),
    )
    print_table(["tool calls", "the agent presents", "", "p50", "p99"], auth_rows(calls, result))
    save("gateway", result)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200)
    main(parser.parse_args().calls)
