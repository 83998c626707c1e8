"""The MCP conformance suite judges the gateway: its server scenarios run against an upstream
written to the suite's server specification directly, then against `undolog mcp` in front of
it, in both eras (the session's, 2025-11-25, and the stateless revision, 2026-07-28). What passes
directly passes through the gateway, scenario by scenario."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import anyio
import mcp_types as types
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import ResourceUpdated, ToolsListChanged

from tests.conftest import Cluster
from tests.support import conformance_suite
from tests.support.gateway_process import GatewayProcess
from tests.support.waiting import eventually

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


async def test_an_upstream_s_changed_tool_list_reaches_agents_of_both_eras(
    cluster: Cluster, namespace: str, upstream: str, tmp_path: Path
) -> None:
    """The upstream adds a tool: a session-era agent gets notifications/tools/list_changed on its
    session, a stateless one on its subscriptions/listen stream, and both list the new tool."""
    config = {"namespace": namespace, "unmapped": "pass", "upstreams": {"everything": {"url": upstream}}}
    gateway = GatewayProcess(cluster.kubeconfig, config, tmp_path)
    told: list[object] = []

    async def heard(message: object) -> None:
        told.append(message)

    try:
        async with (
            Client(gateway.url, mode="legacy", message_handler=heard) as session_agent,
            Client(gateway.url) as agent,
        ):
            assert session_agent.server_capabilities.tools is not None
            assert session_agent.server_capabilities.tools.list_changed
            await session_agent.list_tools()  # the gateway knows the session from its first request
            async with agent.listen(tools_list_changed=True) as changes:
                await agent.call_tool("test_trigger_tool_change", {})
                with anyio.fail_after(10):
                    change = await anext(aiter(changes))
            assert isinstance(change, ToolsListChanged)
            await eventually(
                lambda: asyncio.sleep(0, told),
                lambda seen: any(isinstance(m, types.ToolListChangedNotification) for m in seen),
                10,
                "the session told of the change",
            )
            for client in (session_agent, agent):
                names = [t.name for t in (await client.list_tools()).tools]
                assert "test_added_tool_1" in names, names
    finally:
        gateway.stop()


async def test_a_resource_s_update_reaches_the_stateless_agent_listening_for_it(
    cluster: Cluster, namespace: str, upstream: str, tmp_path: Path
) -> None:
    """A stateless agent's listen stream names a resource: the gateway listens for it upstream,
    and the upstream's update of it reaches the agent (no replay: an update before the gateway's
    own listen stream names it is not seen, so the update is made until one arrives)."""
    config = {"namespace": namespace, "unmapped": "pass", "upstreams": {"everything": {"url": upstream}}}
    gateway = GatewayProcess(cluster.kubeconfig, config, tmp_path)
    uri = "test://watched-resource"
    try:
        async with Client(gateway.url) as agent:
            resources = agent.server_capabilities.resources
            assert resources is not None
            assert resources.subscribe
            async with agent.listen(resource_subscriptions=[uri]) as updates:
                heard = aiter(updates)

                async def updated() -> object:
                    await agent.call_tool("test_trigger_resource_update", {})
                    with anyio.move_on_after(1):
                        return await anext(heard)
                    return None

                event = await eventually(updated, lambda got: got is not None, 15, f"an update of {uri}")
            too_many = [f"test://template/{n}/data" for n in range(101)]
            with pytest.raises(MCPError, match="a stream names at most 100 resources"):
                async with agent.listen(resource_subscriptions=too_many):
                    pass
        assert event == ResourceUpdated(uri)
    finally:
        gateway.stop()
