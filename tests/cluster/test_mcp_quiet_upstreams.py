"""An upstream that stops answering once the gateway has started holds up nothing else. One that
announces its tools changed and then never answers tools/list: the gateway lists the tools again
within the upstream's `connectSeconds`, keeps what that one listed before and says so, and the
changes other upstreams announce still reach agents. One that never answers resources/list: past
its `callSeconds` the agent gets the other upstreams' resources. One that never answers
resources/subscribe: an agent's listen stream naming a resource opens past its `callSeconds`,
and the gateway still stops once the stream has ended (its unsubscribing is shielded). One of
the stateless revision that never acknowledges the gateway's listen stream: listened to again
every `connectSeconds`, while its tools are called as ever. One that refuses the listen stream
(-32601): asked once, and not waited for when an agent's listen stream names a resource. One
whose tools/list no longer answers: an agent's calls of its tools are answered all the same, in
either era (the gateway does not list them again on the agent's client first)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import anyio
import mcp_types as types
import pytest
from mcp import Client

from tests.conftest import Cluster
from tests.support import conformance_suite
from tests.support.gateway_process import GatewayProcess
from tests.support.loopback_mcp import served
from tests.support.waiting import eventually

pytestmark = pytest.mark.cluster
MUTE_LISTER = [sys.executable, "-m", "tests.support.mcp_mute_lister"]


async def test_an_upstream_gone_quiet_after_announcing_a_change_holds_up_no_other_change(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    told: list[object] = []

    async def heard(message: object) -> None:
        told.append(message)

    def changes_told() -> int:
        return sum(isinstance(m, types.ToolListChangedNotification) for m in told)

    async def tool_names(agent: Client) -> list[str]:
        return [t.name for t in (await agent.list_tools()).tools]

    with served("mcp_mute_lister", tmp_path, "--after-change") as quiet, conformance_suite.upstream(tmp_path) as suite:
        upstreams = {"quiet": {"url": quiet, "connectSeconds": 2}, "suite": {"url": suite}}
        gateway = GatewayProcess(
            cluster.kubeconfig, {"namespace": namespace, "unmapped": "pass", "upstreams": upstreams}, tmp_path
        )
        try:
            with anyio.fail_after(60):
                async with Client(gateway.url, mode="legacy", message_handler=heard) as agent:
                    assert "go_quiet" in await tool_names(agent)
                    assert not (await agent.call_tool("go_quiet", {})).is_error
                    await eventually(lambda: asyncio.sleep(0, changes_told()), lambda n: n >= 1, 20, "told once")
                    assert not (await agent.call_tool("test_trigger_tool_change", {})).is_error
                    await eventually(lambda: tool_names(agent), lambda n: "test_added_tool_1" in n, 20, "relisted")
                    assert "go_quiet" in await tool_names(agent)  # as the quiet upstream listed it before
                    assert changes_told() >= 2
        finally:
            gateway.stop()
    said = gateway.log_path.read_text()
    assert (
        "after a change was announced, upstream quiet did not list its tools within 2 s: check that it answers "
        "tools/list, or give it longer with upstreams.quiet.connectSeconds; the tools it listed before are kept"
    ) in said


async def test_an_upstream_that_never_answers_resources_list_is_left_out_of_it_past_its_call_seconds(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    with conformance_suite.upstream(tmp_path) as suite:
        upstreams = {"mute": {"command": [*MUTE_LISTER, "--mute-resources"], "callSeconds": 2}, "suite": {"url": suite}}
        gateway = GatewayProcess(
            cluster.kubeconfig, {"namespace": namespace, "unmapped": "pass", "upstreams": upstreams}, tmp_path
        )
        try:
            with anyio.fail_after(30):
                async with Client(gateway.url, mode="legacy") as agent:
                    listed = await agent.list_resources()
        finally:
            gateway.stop()
    assert listed.resources  # the suite's, the mute upstream asked to cancel and left out
    assert all(str(r.uri).startswith("test://") for r in listed.resources), listed.resources
    said = "upstream mute did not answer its list of resources within 2 s, and was asked to cancel it"
    assert said in gateway.log_path.read_text()


async def test_an_upstream_that_never_answers_resources_subscribe_holds_a_listen_stream_only_its_call_seconds(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    with conformance_suite.upstream(tmp_path) as suite:
        mute = {"command": [*MUTE_LISTER, "--mute-subscribe"], "callSeconds": 2}
        config = {"namespace": namespace, "unmapped": "pass", "upstreams": {"mute": mute, "suite": {"url": suite}}}
        gateway = GatewayProcess(cluster.kubeconfig, config, tmp_path)
        try:
            with anyio.fail_after(30):
                async with (
                    Client(gateway.url) as agent,
                    agent.listen(resource_subscriptions=["test://watched-resource"]),
                ):
                    pass
        finally:
            gateway.stop()  # fails the test past 15 s
    assert "upstream mute did not answer resources/subscribe or unsubscribe within 2 s" in gateway.log_path.read_text()


async def test_an_upstream_that_never_acknowledges_the_gateway_s_listen_stream_is_listened_to_again(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    def warnings() -> int:
        said = gateway.log_path.read_text()
        return said.count("upstream mute did not acknowledge a listen stream within 2 s (its connectSeconds)")

    with conformance_suite.upstream(tmp_path, "--mute-listen") as mute:
        config = {"namespace": namespace, "unmapped": "pass", "upstreams": {"mute": {"url": mute, "connectSeconds": 2}}}
        gateway = GatewayProcess(cluster.kubeconfig, config, tmp_path)
        try:
            await eventually(lambda: asyncio.sleep(0, warnings()), lambda n: n >= 2, 20, "listened to twice")
            with anyio.fail_after(30):
                async with Client(gateway.url) as agent:
                    assert not (await agent.call_tool("test_simple_text", {})).is_error
        finally:
            gateway.stop()


async def test_an_upstream_that_refuses_the_gateway_s_listen_stream_is_not_asked_again(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    def refusals() -> int:
        return gateway.log_path.read_text().count("upstream plain refused subscriptions/listen (Method not found)")

    # The mute lister on HTTP speaks the stateless revision and takes no subscriptions/listen.
    with (
        served("mcp_mute_lister", tmp_path, "--mute-resources") as plain,
        conformance_suite.upstream(tmp_path) as suite,
    ):
        config = {
            "namespace": namespace,
            "unmapped": "pass",
            "upstreams": {"plain": {"url": plain}, "suite": {"url": suite}},
        }
        gateway = GatewayProcess(cluster.kubeconfig, config, tmp_path)
        try:
            await eventually(lambda: asyncio.sleep(0, refusals()), lambda n: n >= 1, 20, "refused")
            with anyio.fail_after(30):
                async with Client(gateway.url) as agent:
                    for uri in ("test://watched-resource", "test://static-text"):  # each opens the gateway's again
                        async with agent.listen(resource_subscriptions=[uri]):
                            pass
                    assert not (await agent.call_tool("test_simple_text", {})).is_error
        finally:
            gateway.stop()
    assert refusals() == 1
    assert "what plain announces could not be listened to" not in gateway.log_path.read_text()


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_an_agent_s_calls_are_answered_by_an_upstream_that_no_longer_lists_its_tools(
    cluster: Cluster, namespace: str, tmp_path: Path, mode: str
) -> None:
    with served("mcp_mute_lister", tmp_path, "--after-change") as quiet:
        config = {"namespace": namespace, "unmapped": "pass", "upstreams": {"quiet": {"url": quiet, "callSeconds": 5}}}
        gateway = GatewayProcess(cluster.kubeconfig, config, tmp_path)
        try:
            with anyio.fail_after(30):
                async with Client(gateway.url, mode=mode) as agent:  # over a client the gateway keeps for it
                    for _ in range(2):  # the first call leaves tools/list unanswered from then on
                        result = await agent.call_tool("go_quiet", {})
                        assert not result.is_error, result
                        # the upstream's answer, first (on the stateless revision the saga's handle follows)
                        assert result.content[0] == types.TextContent(type="text", text="quiet from now on")
        finally:
            gateway.stop()
