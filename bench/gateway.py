"""What `undolog mcp` adds to a tool call: N mapped calls (the tracker's create_issue, undone by
close_issue) through the gateway, each beside the same call made directly to the tracker, one
after the other in the same run, so both meet the same box; first on today's stateless revision
(2026-07-28: the `mcp` package's Client with its defaults, the saga handle passed back, each
call resuming the saga from the ledger), then on the session era (2025-11-25). Reported: p50
and p99 of each, what the gateway adds (the difference), and the API writes per call (the
apiserver's own counts). The first calls, which open the saga, are left out, as is the
client's handshake; a read-only tool (passed through, nothing written) shows the hop alone.

The floor of what the gateway adds to a mapped call: the two durable writes no gateway with a
ledger can avoid (an UndoEntry created, then its status patched with the outcome, made in the
same rounds from Python with the project's API client and no logic, their bodies made before
the clock starts) plus the hop of a read-only call. Its p50 (p99) is the writes' p50 (p99) plus
the hop's; reported on both protocol paths, with the ratio of what the gateway adds to it.
`--profile DIR` samples the gateway process with py-spy during the mapped calls of each path
(collapsed stacks for `python -m bench.profile`).

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
from typing import Any

import httpx2
from devtools.control_plane.local import free_port
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from tests.cluster.test_mcp_auth import service_account_token
from tests.support.gateway_process import GatewayProcess, gateway_config
from tests.support.hydra import Hydra
from tests.support.mcp_tracker import Tracker

from bench.compensation import percentile
from bench.harness import bench_cluster, delta, print_table, profiled, save
from undolog.api import Call, Saga
from undolog.conventions import creation_body, new_undo_entry, timestamp
from undolog.kube import Kube
from undolog.sdk import open_saga


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


async def session_era(
    bench: Any, namespace: str, gateway: GatewayProcess, tracker: Tracker, calls: int, profile: Path | None
) -> dict[str, Any]:
    """The figures of the session era (2025-11-25), with the floor's writes in the same rounds."""
    floor = Floor(bench.kube, namespace, await floor_saga(bench.kube, namespace))
    async with Client(tracker.url, mode="legacy") as upstream, Client(gateway.url, mode="legacy") as agent:
        direct, through, writes_alone, read_direct, read_through = [], [], [], [], []
        for title in ("warm", "up"):  # the saga is opened by the first mapped call
            await upstream.call_tool("create_issue", {"title": title})
            await agent.call_tool("create_issue", {"title": title})
        before = await bench.writes()
        async with profiled(gateway.process.pid, profile and profile / "gateway-session.txt"):
            for n in range(calls):
                direct.append(await timed(upstream.call_tool("create_issue", {"title": f"d{n}"})))
                through.append(await timed(agent.call_tool("create_issue", {"title": f"g{n}"})))
                writes_alone.append(await floor.two_writes(n))
        writes = delta(await bench.writes(), before)
        for _ in range(calls):  # a read-only tool passes straight through: the hop alone
            read_direct.append(await timed(upstream.call_tool("list_issues", {})))
            read_through.append(await timed(agent.call_tool("list_issues", {})))
        await agent.call_tool("undolog_commit", {})
    return {
        "direct": figures(direct),
        "through_gateway": figures(through),
        "added": difference(through, direct),
        "read_only_added": difference(read_through, read_direct),
        **floor_of(through, direct, writes_alone, read_through, read_direct),
        "api_writes": writes,
        "entry_writes_per_call": round((writes.get("undoentries", 0) - 2 * calls) / calls, 2),
        "saga_writes_per_call": round(writes.get("sagas", 0) / calls, 2),
    }


def floor_of(
    through: list[float], direct: list[float], writes: list[float], read_through: list[float], read_direct: list[float]
) -> dict[str, Any]:
    """The floor (the two writes alone, plus the read-only hop) and what the gateway adds to a
    mapped call as a multiple of it."""
    alone, hop, added = figures(writes), difference(read_through, read_direct), difference(through, direct)
    floor = {k: round(alone[k] + hop[k], 2) for k in ("p50_ms", "p99_ms")}
    return {
        "ledger_writes": alone,
        "floor": floor,
        "added_to_floor": {k: round(added[k] / floor[k], 2) for k in ("p50_ms", "p99_ms")},
    }


def bearing(url: str, token: str | None) -> Client:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    return Client(streamable_http_client(url, http_client=httpx2.AsyncClient(headers=headers, timeout=60)))


async def routes(
    bench: Any, namespace: str, tracker: Tracker, calls: int, agents: dict[str, Client], profiling: Any
) -> dict[str, Any]:
    """Stateless calls, round after round: directly, then through each agent's gateway; each
    agent's saga opened first (left out). Per route: mapped and read-only p50 and p99."""
    mapped: dict[str, list[float]] = {"direct": [], "ledger": [], **{name: [] for name in agents}}
    read: dict[str, list[float]] = {"direct": [], **{name: [] for name in agents}}
    floor = Floor(bench.kube, namespace, await floor_saga(bench.kube, namespace))
    async with Client(tracker.url) as upstream:
        handles = {}
        for name, agent in agents.items():
            opened = await agent.call_tool("create_issue", {"title": f"open {name}"})
            handles[name] = {HANDLE: str((opened.meta or {})["io.undolog/saga-handle"])}
        before = await bench.writes()
        async with profiling:
            for n in range(calls):
                mapped["direct"].append(await timed(upstream.call_tool("create_issue", {"title": f"d{n}"})))
                for name, agent in agents.items():
                    mapped[name].append(
                        await timed(agent.call_tool("create_issue", {"title": f"{name}{n}"} | handles[name]))
                    )
                mapped["ledger"].append(await floor.two_writes(n))
        writes = delta(await bench.writes(), before)
        for agent in (upstream, *agents.values()):  # the first read of each makes its connection
            await agent.call_tool("list_issues", {})
        for _ in range(calls):
            read["direct"].append(await timed(upstream.call_tool("list_issues", {})))
            for name, agent in agents.items():
                read[name].append(await timed(agent.call_tool("list_issues", {})))
        for name, agent in agents.items():
            await agent.call_tool("undolog_commit", handles[name])
    return {"mapped": mapped, "read": read, "writes": writes}


async def floor_saga(kube: Kube, namespace: str) -> Saga:
    """A saga for the floor's entries (no operator runs in this benchmark: nothing drives it)."""
    return (await open_saga(generate_name="bench-floor-", namespace=namespace, kube=kube)).saga


class Floor:
    """The two writes a mapped call must make, from Python with no logic: an UndoEntry created
    (the body the SDK makes, made before the clock starts), then its status patched with the
    outcome, conditionally."""

    def __init__(self, kube: Kube, namespace: str, saga: Saga) -> None:
        self.kube, self.namespace, self.saga = kube, namespace, saga

    async def two_writes(self, n: int) -> float:
        compensation = Call(function="tracker.close-issue", args={"number": n})
        entry = creation_body(new_undo_entry(self.saga, n + 1, f"create_issue-{n + 1}", compensation))
        name = entry["metadata"]["name"]
        outcome = {"effect": "Committed", "output": {"number": n}, "executedAt": timestamp()}
        began = time.perf_counter()
        created = await self.kube.create("undoentries", self.namespace, entry)
        patch = {"metadata": {"resourceVersion": created["metadata"]["resourceVersion"]}, "status": outcome}
        await self.kube.patch_status("undoentries", self.namespace, name, patch)
        return (time.perf_counter() - began) * 1000


async def measure(calls: int, profile: Path | None = None) -> dict[str, Any]:
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
                    profiling = profiled(gateway.process.pid, profile and profile / "gateway-stateless.txt")
                    stateless = await routes(bench, namespace, tracker, calls, agents, profiling)
                session = await session_era(bench, namespace, gateway, tracker, calls, profile)
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
    steps_a_round = 4  # the open agent's, the ServiceAccount's, the JWT's and the floor's each make one entry
    return {
        "direct": figures(mapped["direct"]),
        "through_gateway": figures(mapped["open"]),
        "added": difference(mapped["open"], mapped["direct"]),
        "read_only_added": difference(read["open"], read["direct"]),
        **floor_of(mapped["open"], mapped["direct"], mapped["ledger"], read["open"], read["direct"]),
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
        [calls, era, "added to a read-only call (passed through)", *ms(result["read_only_added"]), 0, 0],
        [calls, era, "the two entry writes alone (from Python, no logic)", *ms(result["ledger_writes"]), 2, 0],
        [calls, era, "the floor: the two writes and the read-only hop", *ms(result["floor"]), "", ""],
        [calls, era, "added by the gateway, as a multiple of the floor", *ratio(result["added_to_floor"]), "", ""],
    ]


def ratio(figure: dict[str, float]) -> list[str]:
    return [f"{figure['p50_ms']}x", f"{figure['p99_ms']}x"]


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


def main(calls: int, profile: Path | None) -> None:
    result = asyncio.run(measure(calls, profile))
    print_table(
        ["tool calls", "protocol", "", "p50", "p99", "entry writes/call", "saga writes/call"],
        rows(calls, "2026-07-28 (handle)", result) + rows(calls, "2025-11-25 (session)", result["session"]),
    )
    print_table(["tool calls", "the agent presents", "", "p50", "p99"], auth_rows(calls, result))
    save("gateway", result)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument(
        "--profile", type=Path, help="py-spy the gateway during the mapped calls; stacks in this folder"
    )
    arguments = parser.parse_args()
    main(arguments.calls, arguments.profile)
