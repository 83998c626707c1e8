"""The MCP conformance suite judges the gateway: its server scenarios run against an upstream
directly, then against `undolog mcp` in front of it, in both eras (the session's, 2025-11-25,
and the stateless revision, 2026-07-28). What passes directly passes through the gateway,
scenario by scenario. Two upstreams: one written to the suite's server specification, and
`@modelcontextprotocol/server-everything` from npm, which nobody here wrote."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from devtools.control_plane.local import free_port
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import ResourceUpdated

from tests.cluster.test_mcp_auth import service_account_token
from tests.conftest import Cluster
from tests.support import conformance_suite
from tests.support.gateway_process import GatewayProcess
from tests.support.round_robin import RoundRobin
from tests.support.told_of_changes import both_eras_told
from undolog.kube import Kube

pytestmark = pytest.mark.cluster


# server-everything answers a call of a tool it does not list with an isError result, which
# these scenarios count as their pass; the gateway refuses a tool no upstream lists with the
# JSON-RPC error the specification says (-32602), so they pass only directly.
UNLISTED = {"tools-call-simple-text": "test_simple_text", "tools-call-error": "test_error_handling"}


DIRECT: dict[tuple[str, str], dict[str, bool]] = {}  # by server and era: the suite's run directly, once


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with conformance_suite.upstream(tmp_path_factory.mktemp("conformance")) as url:
        yield url


@pytest.fixture(scope="module")
def everything(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with conformance_suite.everything(tmp_path_factory.mktemp("everything")) as url:
        yield url


@pytest.mark.parametrize(
    ("server", "auth"), [("ours", "none"), ("ours", "serviceAccounts"), ("server-everything", "none")]
)
@pytest.mark.parametrize("era", list(conformance_suite.ERAS))
async def test_what_passes_directly_passes_through_the_gateway(
    cluster: Cluster,
    kube: Kube,
    namespace: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    era: str,
    server: str,
    auth: str,
) -> None:
    """With authentication on, the suite (which sends no token) reaches the gateway through a
    proxy that puts a ServiceAccount's token for the gateway on each of its requests."""
    upstream: str = request.getfixturevalue("upstream" if server == "ours" else "everything")
    if (server, era) not in DIRECT:
        DIRECT[server, era] = conformance_suite.scenarios(upstream, era, tmp_path)
    direct = DIRECT[server, era]
    config = {"namespace": namespace, "unmapped": "pass", "upstreams": {"everything": {"url": upstream}}}
    port = free_port()
    resource = f"http://127.0.0.1:{port}/mcp"
    if auth != "none":
        config["auth"] = {"resource": resource, "serviceAccounts": True}
    gateway = GatewayProcess(cluster.kubeconfig, config, tmp_path, port=port)
    bearing = None
    if auth != "none":
        await kube.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": "suite"}})
        token = await service_account_token(kube, namespace, "suite", resource)
        bearing = RoundRobin([gateway.base], {"authorization": f"Bearer {token}"})
    try:
        url = bearing.url if bearing else gateway.url
        through = await anyio.to_thread.run_sync(conformance_suite.scenarios, url, era, tmp_path)
    finally:
        if bearing:
            bearing.stop()
        gateway.stop()
    width = max(map(len, direct))
    print("\n" + "\n".join(f"{n:<{width}}  direct {direct[n]!s:<5}  through {through.get(n)}" for n in direct))
    passed = f"{sum(direct.values())}/{len(direct)} directly, {sum(through.values())}/{len(direct)} through"
    print(f"{server}, {era}, auth {auth}: {passed}")
    lost = [n for n in direct if direct[n] and not through.get(n)]
    assert [n for n in lost if n not in UNLISTED or server == "ours"] == []
    async with Client(upstream, mode="legacy") as client:
        listed = {tool.name for tool in (await client.list_tools()).tools}
        for name in lost:
            assert UNLISTED[name] not in listed
            assert (await client.call_tool(UNLISTED[name], {})).is_error


async def test_an_upstream_s_changed_tool_list_reaches_agents_of_both_eras(
    cluster: Cluster, namespace: str, upstream: str, tmp_path: Path
) -> None:
    """The upstream (of the stateless revision, heard on the gateway's listen stream to it) adds a
    tool: the gateway advertises that its lists change, lists the tools again and tells every
    agent."""
    config = {"namespace": namespace, "unmapped": "pass", "upstreams": {"everything": {"url": upstream}}}
    gateway = GatewayProcess(cluster.kubeconfig, config, tmp_path)
    try:
        async with Client(gateway.url, mode="legacy") as session_agent:
            tools = session_agent.server_capabilities.tools
            assert tools is not None
            assert tools.list_changed
        await both_eras_told(gateway.url, "test_trigger_tool_change", "test_added_tool_1")
    finally:
        gateway.stop()


async def test_a_resource_s_update_reaches_the_stateless_agent_listening_for_it(
    cluster: Cluster, namespace: str, upstream: str, tmp_path: Path
) -> None:
    """A stateless agent's listen stream names a resource: the gateway listens for it upstream
    before it acknowledges the stream, so the upstream's next update of it reaches the agent."""
    config = {"namespace": namespace, "unmapped": "pass", "upstreams": {"everything": {"url": upstream}}}
    gateway = GatewayProcess(cluster.kubeconfig, config, tmp_path)
    uri = "test://watched-resource"
    try:
        async with Client(gateway.url) as agent:
            resources = agent.server_capabilities.resources
            assert resources is not None
            assert resources.subscribe
            async with Client(upstream) as direct, agent.listen(resource_subscriptions=[uri]) as updates:
                # Updated at once, straight on the upstream: no round trip through the gateway to wait for it.
                assert not (await direct.call_tool("test_trigger_resource_update", {})).is_error
                with anyio.fail_after(10):
                    event = await anext(aiter(updates))
            too_many = [f"test://template/{n}/data" for n in range(101)]
            with pytest.raises(MCPError, match="a stream names at most 100 resources"):
                async with agent.listen(resource_subscriptions=too_many):
                    pass
        assert event == ResourceUpdated(uri)
    finally:
        gateway.stop()
