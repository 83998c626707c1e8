"""A tool whose arguments the stateless revision mirrors into `Mcp-Param-*` headers
(`x-mcp-header`) is called through the gateway in both eras: the gateway's own client of the
upstream sends the headers the upstream requires, though it did not list the tools itself."""

from __future__ import annotations

from pathlib import Path

import anyio
import mcp_types as types
import pytest
from mcp import Client

from tests.conftest import Cluster
from tests.support.gateway_process import GatewayProcess
from tests.support.loopback_mcp import served

pytestmark = pytest.mark.cluster


def said(result: types.CallToolResult) -> str:
    assert not result.is_error, result
    first = result.content[0]
    assert isinstance(first, types.TextContent)
    return first.text


async def test_a_tool_with_mcp_param_headers_is_called_through_the_gateway_in_either_era(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    with served("mcp_param_headers", tmp_path) as upstream:
        config = {"namespace": namespace, "unmapped": "pass", "upstreams": {"regional": {"url": upstream}}}
        gateway = GatewayProcess(cluster.kubeconfig, config, tmp_path)
        try:
            for mode in ("auto", "legacy"):  # the stateless revision, then a session
                with anyio.fail_after(30):
                    async with Client(gateway.url, mode=mode) as agent:
                        listed = {t.name: t for t in (await agent.list_tools()).tools}
                        assert listed["tagged"].input_schema["properties"]["region"]["x-mcp-header"] == "Region"
                        assert said(await agent.call_tool("tagged", {"region": "eu-west"})) == "called for eu-west"
                        assert said(await agent.call_tool("tagged", {"region": "us-east"})) == "called for us-east"
        finally:
            gateway.stop()
