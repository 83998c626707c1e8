"""The MCP conformance suite judges the gateway: its server scenarios run against an upstream
written to the suite's server specification directly, then against `undolog mcp` in front of
it, in both eras (the session's, 2025-11-25, and the stateless revision, 2026-07-28). What passes
directly passes through the gateway, scenario by scenario."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Cluster
from tests.support import conformance_suite
from tests.support.gateway_process import GatewayProcess

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with conformance_suite.upstream(tmp_path_factory.mktemp("conformance")) as url:
        yield url


@pytest.mark.parametrize("era", list(conformance_suite.ERAS))
def test_what_passes_directly_passes_through_the_gateway(
    cluster: Cluster, namespace: str, upstream: str, tmp_path: Path, era: str
) -> None:
    direct = conformance_suite.scenarios(upstream, era, tmp_path)
    config = {"namespace": namespace, "unmapped": "pass", "upstreams": {"everything": {"url": upstream}}}
    gateway = GatewayProcess(cluster.kubeconfig, config, tmp_path)
    try:
        through = conformance_suite.scenarios(gateway.url, era, tmp_path)
    finally:
        gateway.stop()
    width = max(map(len, direct))
    print("\n" + "\n".join(f"{n:<{width}}  direct {direct[n]!s:<5}  through {through.get(n)}" for n in direct))
    print(f"{era}: {sum(direct.values())}/{len(direct)} directly, {sum(through.values())}/{len(direct)} through")
    assert [n for n in direct if direct[n] and not through.get(n)] == []
