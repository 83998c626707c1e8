"""The MCP conformance suite's server scenarios against the tests' upstream (written to the
suite's server specification) and against `@modelcontextprotocol/server-everything` from npm,
each directly and through `undolog mcp` in front of it, in both eras: the scenarios that pass
each way, named, and their counts.

    python -m bench.conformance
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tests.support import conformance_suite
from tests.support.gateway_process import GatewayProcess

from bench.harness import bench_cluster, print_table, save


async def measure() -> dict[str, Any]:
    results: dict[str, Any] = {}
    async with bench_cluster() as bench:
        namespace = await bench.namespace("conformance")
        with conformance_suite.upstream(bench.work) as upstream:
            results.update(await judged(upstream, bench.kubeconfig, namespace, bench.work))
        with conformance_suite.everything(bench.work) as upstream:
            results["server-everything"] = await judged(upstream, bench.kubeconfig, namespace, bench.work)
    return results


async def judged(upstream: str, kubeconfig: Path, namespace: str, work: Path) -> dict[str, Any]:
    """By era, the scenarios that pass against `upstream` directly and through a gateway."""
    config = {"namespace": namespace, "unmapped": "pass", "upstreams": {"everything": {"url": upstream}}}
    gateway = GatewayProcess(kubeconfig, config, work)
    results: dict[str, Any] = {}
    try:
        for era in conformance_suite.ERAS:
            direct = await asyncio.to_thread(conformance_suite.scenarios, upstream, era, work)
            through = await asyncio.to_thread(conformance_suite.scenarios, gateway.url, era, work)
            results[era] = {
                "scenarios": len(direct),
                "direct": sorted(n for n, ok in direct.items() if ok),
                "through_gateway": sorted(n for n, ok in through.items() if ok),
            }
    finally:
        gateway.stop()
    return results


def main() -> None:
    results = asyncio.run(measure())
    print_table(
        ["protocol", "scenarios", "passed directly", "passed through the gateway"],
        [
            [f"{era} ({server})", r["scenarios"], len(r["direct"]), len(r["through_gateway"])]
            for server, eras in (("tests' upstream", results), ("server-everything", results["server-everything"]))
            for era, r in eras.items()
            if era in conformance_suite.ERAS
        ],
        ledger="etcd fsync as the other benchmarks; the suite's own pass/fail",
    )
    save("conformance", results)


if __name__ == "__main__":
    main()
