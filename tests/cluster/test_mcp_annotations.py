"""Undo a server advertises (`compensations: fromAnnotations`): a tool whose annotations name its
compensating tool (SEP-3172's `recovery`, `x-compensation-pair`) is mapped with no configuration,
on a real server (the official TypeScript SDK over stdio) whose annotations the gateway reads as
sent; one whose undo cannot be followed stays unmapped, and the configuration wins."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
import pytest_asyncio
from mcp import Client
from mcp.shared.exceptions import MCPError

from tests.cluster.test_mcp_catalog import serving_operator_calls
from tests.cluster.test_mcp_gateway import only_saga
from tests.cluster.test_mcp_stateless import HANDLE, handle_of
from tests.conftest import REPO, Cluster
from tests.support.gateway_process import GatewayProcess
from tests.support.told_of_changes import both_eras_told
from tests.support.waiting import saga_phase
from undolog.kube import Kube

pytestmark = pytest.mark.cluster
SERVER = REPO / "tests" / "mcp_agent" / "annotated_server.mjs"


@pytest_asyncio.fixture
async def gateway(cluster: Cluster, kube: Kube, namespace: str, tmp_path: Path) -> AsyncIterator[GatewayProcess]:
    config = {
        "compensations": "fromAnnotations",
        "upstreams": {"shop": {"command": ["node", str(SERVER)]}},
        "tools": {"shop.stock": {"readOnly": True}},
    }
    process = await serving_operator_calls(cluster.kubeconfig, kube, namespace, tmp_path, config)
    yield process
    process.stop()


async def stock(agent: Client) -> dict[str, Any]:
    result = await agent.call_tool("stock", {})
    held: dict[str, Any] = json.loads("".join(c.text for c in result.content if isinstance(c, types.TextContent)))
    return held


@pytest.mark.usefixtures("operator")
async def test_what_a_server_advertises_is_undone_and_what_it_cannot_say_is_refused(
    kube: Kube, namespace: str, gateway: GatewayProcess
) -> None:
    log = gateway.log_path.read_text()
    print("\n" + "\n".join(line for line in log.splitlines() if "shop." in line))
    assert "shop.reserve undone by shop.release, as its server advertises" in log
    assert "shop.tag undone by shop.untag, as its server advertises" in log
    assert "shop.charge left unmapped" in log
    async with Client(gateway.url) as agent:
        handle = handle_of(await agent.call_tool("reserve", {"sku": "book"}))
        assert not (await agent.call_tool("tag", {"item": "book", "tag": "gift", HANDLE: handle})).is_error
        with pytest.raises(MCPError, match=r"tool shop\.charge is not mapped"):
            await agent.call_tool("charge", {"amount": 5, HANDLE: handle})
        assert await stock(agent) == {"reservations": ["book"], "tags": ["book:gift"]}
        await agent.call_tool("undolog_abort", {HANDLE: handle, "reason": "undo what it advertised"})
        name = await only_saga(kube, namespace)
        await saga_phase(kube, namespace, name, "Compensated")
        assert await stock(agent) == {"reservations": [], "tags": []}
    entries = {e["spec"]["step"]: e["spec"]["compensation"] for e in await kube.list("undoentries", namespace)}
    assert (entries["reserve-1"]["function"], entries["reserve-1"]["args"]) == (
        "shop.release",
        {"reservationId": "${steps.reserve-1.output.reservation.id}"},
    )
    assert entries["tag-2"]["args"] == {"tagId": "${steps.tag-2.output.tagId}"}


async def test_a_stdio_server_s_changed_tool_list_reaches_agents_of_both_eras(gateway: GatewayProcess) -> None:
    """A server on sessions only (stdio, the TypeScript SDK 1.x) adds a tool and says so on the
    gateway's one connection to it: the gateway lists its tools again and tells every agent."""
    await both_eras_told(gateway.url, "open_aisle", "aisle_1")
