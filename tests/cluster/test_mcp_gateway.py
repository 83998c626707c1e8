"""Undo for any MCP agent: `undolog mcp` in front of a real MCP server (the tracker), agents
that are real MCP clients (the `mcp` package's in Python, the official SDK's in TypeScript on
node), and the operator compensating through the MCP transport (`close_issue` on the same
server, under each entry's key)."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import mcp_types as types
import pytest
import pytest_asyncio
import yaml
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.shared.exceptions import MCPError

from tests.cluster.test_packaging import rendered
from tests.conftest import REPO, Cluster
from tests.support.gateway_process import GatewayProcess, gateway_config
from tests.support.manifests import webhook
from tests.support.mcp_tracker import Tracker
from tests.support.operator_process import OperatorProcess
from tests.support.waiting import eventually, saga_phase
from undolog.api.gateway import GatewayConfig
from undolog.gateway.run import load
from undolog.kube import Body, Kube

pytestmark = pytest.mark.cluster

AGENT = REPO / "tests" / "mcp_agent"


@pytest.fixture
def tracker() -> Iterator[Tracker]:
    served = Tracker()
    yield served
    served.stop()


@pytest_asyncio.fixture
async def close_issue_webhook(kube: Kube, namespace: str, tracker: Tracker) -> None:
    """The operator's way to close_issue: a Webhook whose version is an MCP tool."""
    await kube.create(
        "webhooks", namespace, webhook("tracker.close-issue", url=tracker.url, mcp={"tool": "close_issue"})
    )


@pytest.fixture
def gateway(cluster: Cluster, namespace: str, tracker: Tracker, tmp_path: Path) -> Iterator[GatewayProcess]:
    process = GatewayProcess(cluster.kubeconfig, gateway_config(namespace, tracker), tmp_path)
    yield process
    process.stop()


async def only_saga(kube: Kube, namespace: str) -> str:
    sagas = await eventually(lambda: kube.list("sagas", namespace), lambda found: len(found) == 1, 10, "one saga")
    return str(sagas[0]["metadata"]["name"])


@pytest.mark.usefixtures("close_issue_webhook", "operator")
async def test_a_python_agent_s_failed_session_is_undone_newest_first_by_the_same_mcp_server(
    kube: Kube,
    namespace: str,
    tracker: Tracker,
    gateway: GatewayProcess,
) -> None:
    async with Client(gateway.url, mode="legacy") as agent:
        names = {tool.name for tool in (await agent.list_tools()).tools}
        assert {"create_issue", "close_issue", "list_issues", "undolog_abort", "undolog_rewind"} <= names
        for title in ("one", "two"):
            assert not (await agent.call_tool("create_issue", {"title": title})).is_error
        failed = await agent.call_tool("create_issue", {"title": "three", "fail": True})
        assert failed.is_error
        assert (await agent.call_tool("list_issues", {})).content  # read-only: straight through
        said = await agent.call_tool("undolog_abort", {"reason": "the third issue failed"})
        text = said.content[0].text  # type: ignore[union-attr]
        assert "aborted" in text, text
        assert text.index("create_issue-3") < text.index("create_issue-2") < text.index("create_issue-1"), text
    name = await only_saga(kube, namespace)
    await saga_phase(kube, namespace, name, "Compensated")
    assert [close.number for close in tracker.issues.closes] == [3, 2, 1]
    assert [tracker.issues.state(n) for n in (1, 2, 3)] == ["closed"] * 3
    keys = [close.meta_key for close in tracker.issues.closes]
    assert len(set(keys)) == 3
    assert all(keys)
    assert all(close.header_key == close.meta_key for close in tracker.issues.closes)
    entries = await kube.list("undoentries", namespace)
    assert {f"undo-{e['spec']['undoId']}" for e in entries} == set(keys)
    # The forward calls went upstream under their steps' keys, also in _meta.
    assert all(tracker.issues.created_keys)
    assert len(set(tracker.issues.created_keys)) == 3


async def test_a_tool_neither_mapped_nor_read_only_is_refused_naming_how_to_map_it(
    kube: Kube, namespace: str, tracker: Tracker, gateway: GatewayProcess
) -> None:
    async with Client(gateway.url, mode="legacy") as agent:
        opened = await agent.call_tool("create_issue", {"title": "one"})
        assert opened.meta
        assert opened.meta["io.undolog/step"] == "create_issue-1"
        with pytest.raises(MCPError) as refused:
            await agent.call_tool("label_issue", {"number": 1, "label": "bug"})
        assert "tracker.label_issue is not mapped" in str(refused.value)
        assert "tools.tracker.label_issue" in str(refused.value)
    assert "labels" not in tracker.issues.opened[1]  # nothing reached the tracker


@pytest.mark.usefixtures("close_issue_webhook", "operator")
async def test_a_session_that_ends_without_a_commit_is_aborted(
    kube: Kube,
    namespace: str,
    tracker: Tracker,
    gateway: GatewayProcess,
) -> None:
    async with Client(gateway.url, mode="legacy") as agent:  # leaving it sends DELETE: the session ends
        await agent.call_tool("create_issue", {"title": "one"})
    name = await only_saga(kube, namespace)
    saga = await saga_phase(kube, namespace, name, "Compensated")
    assert "session ended without a commit" in saga["metadata"]["annotations"]["undolog.io/abort-reason"]
    assert tracker.issues.state(1) == "closed"


def node_agent(gateway: GatewayProcess, scenario: str) -> list[dict[str, Any]]:
    node = shutil.which("node")
    assert node, "node is needed for the TypeScript agent (the machine's Node 20)"
    assert (AGENT / "node_modules" / "@modelcontextprotocol" / "sdk").is_dir(), "run make mcp-agent (npm ci)"
    done = subprocess.run(
        [node, "agent.mjs", gateway.url, scenario], cwd=AGENT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


@pytest.mark.usefixtures("close_issue_webhook", "operator")
async def test_a_typescript_agent_gets_undo_with_no_undolog_code(
    kube: Kube,
    namespace: str,
    tracker: Tracker,
    gateway: GatewayProcess,
) -> None:
    said = node_agent(gateway, "fail-third")
    print("\n" + "\n".join(json.dumps(line) for line in said))
    assert [line.get("isError") for line in said[1:]] == [False, False, True, False]
    name = await only_saga(kube, namespace)
    await saga_phase(kube, namespace, name, "Compensated")
    print("\n".join(f"closed #{close.number} under {close.meta_key}" for close in tracker.issues.closes))
    assert [close.number for close in tracker.issues.closes] == [3, 2, 1]
    assert len({close.meta_key for close in tracker.issues.closes}) == 3


@pytest.mark.usefixtures("close_issue_webhook", "operator")
async def test_a_typescript_agent_rewinds_to_its_first_step_and_carries_on(
    kube: Kube,
    namespace: str,
    tracker: Tracker,
    gateway: GatewayProcess,
) -> None:
    said = node_agent(gateway, "rewind")
    print("\n" + "\n".join(json.dumps(line) for line in said))
    rewound = next(line for line in said if line.get("name") == "undolog_rewind")
    assert not rewound["isError"], rewound
    name = await only_saga(kube, namespace)
    await saga_phase(kube, namespace, name, "Completed")
    assert [close.number for close in tracker.issues.closes] == [3, 2]
    assert [tracker.issues.state(n) for n in (1, 2, 3, 4)] == ["open", "closed", "closed", "open"]


async def test_the_mcp_transport_is_fenced_in_by_the_egress_policy(
    cluster: Cluster,
    kube: Kube,
    namespace: str,
    tracker: Tracker,
    close_issue_webhook: None,
    gateway: GatewayProcess,
    tmp_path: Path,
) -> None:
    fenced = OperatorProcess(cluster.kubeconfig, namespace, tmp_path / "fenced", allow_loopback=False)
    (tmp_path / "fenced").mkdir()
    fenced.start()
    try:
        async with Client(gateway.url, mode="legacy") as agent:
            await agent.call_tool("create_issue", {"title": "one"})
            await agent.call_tool("undolog_abort", {"reason": "test"})
        name = await only_saga(kube, namespace)
        halted = await saga_phase(kube, namespace, name, "Halted")
        assert "refused by the operator's egress policy" in halted["status"]["message"], halted["status"]["message"]
        assert tracker.issues.closes == []
    finally:
        fenced.stop()


@pytest.mark.usefixtures("close_issue_webhook", "operator")
async def test_the_chart_s_gateway_role_is_all_a_session_needs(
    cluster: Cluster, kube: Kube, namespace: str, tracker: Tracker, tmp_path: Path
) -> None:
    documents = rendered(
        "gateway.enabled=true",
        "gateway.config.auth=none",
        f"gateway.namespace={namespace}",
        f"gateway.config.upstreams.tracker.url={tracker.url}",
    )
    chart_config = next(d for d in documents if d["kind"] == "ConfigMap" and "gateway" in d["metadata"]["name"])
    from_chart = load_config(chart_config["data"]["gateway.yaml"], tmp_path)
    assert (from_chart.namespace, from_chart.upstreams["tracker"].url) == (namespace, tracker.url)
    access = [d for d in documents if d["kind"] in ("Role", "RoleBinding") and "gateway" in d["metadata"]["name"]]
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "undolog-gateway"}}
    for document in (*access, account):
        document["metadata"]["namespace"] = namespace
        document.get("subjects", [{}])[0]["namespace"] = namespace
    cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all([account, *access]))
    as_gateway = f"--as=system:serviceaccount:{namespace}:undolog-gateway"
    gateway = GatewayProcess(cluster.kubeconfig, gateway_config(namespace, tracker), tmp_path, as_gateway)
    try:
        async with Client(gateway.url, mode="legacy") as agent:
            await agent.call_tool("create_issue", {"title": "one"})
            status = await agent.call_tool("undolog_status", {})
            assert "create_issue-1 → tracker.close-issue" in status.content[0].text  # type: ignore[union-attr]
            assert not (await agent.call_tool("undolog_abort", {"reason": "done"})).is_error
        name = await only_saga(kube, namespace)
        await saga_phase(kube, namespace, name, "Compensated")
        assert tracker.issues.state(1) == "closed"
    finally:
        gateway.stop()


def load_config(text: str, tmp_path: Path) -> GatewayConfig:
    path = tmp_path / "from-chart.yaml"
    path.write_text(text)
    return load(str(path))


@pytest.mark.usefixtures("close_issue_webhook", "operator")
async def test_an_agent_that_starts_the_gateway_over_stdio_gets_the_same_undo(
    cluster: Cluster, kube: Kube, namespace: str, tracker: Tracker, tmp_path: Path
) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(gateway_config(namespace, tracker)))
    command = ["-m", "undolog.cli", "mcp", "--stdio", "--config", str(path), "--kubeconfig", str(cluster.kubeconfig)]
    async with Client(StdioServerParameters(command=sys.executable, args=command), mode="legacy") as agent:
        for title in ("one", "two"):
            await agent.call_tool("create_issue", {"title": title})
    # stdin closed: the session ended without a commit, so its saga is aborted.
    name = await only_saga(kube, namespace)
    await saga_phase(kube, namespace, name, "Compensated")
    assert [close.number for close in tracker.issues.closes] == [2, 1]


@pytest.mark.usefixtures("close_issue_webhook", "operator")
async def test_a_gateway_that_stops_ends_its_open_sessions_and_counts_what_it_did(
    kube: Kube, namespace: str, tracker: Tracker, gateway: GatewayProcess
) -> None:
    async with Client(gateway.url, mode="legacy") as agent:
        await agent.call_tool("create_issue", {"title": "one"})
        await agent.call_tool("list_issues", {})
        async with httpx.AsyncClient() as http:
            scraped = (await http.get(f"http://127.0.0.1:{gateway.port}/metrics", timeout=5)).text
        assert 'undolog_gateway_tool_calls_total{outcome="registered",tool="tracker.create_issue"} 1.0' in scraped
        assert 'undolog_gateway_tool_calls_total{outcome="passed",tool="tracker.list_issues"} 1.0' in scraped
        gateway.stop()  # SIGTERM while the session is open
    name = await only_saga(kube, namespace)
    saga = await saga_phase(kube, namespace, name, "Compensated")
    assert "the gateway stopped" in saga["metadata"]["annotations"]["undolog.io/abort-reason"]


async def test_an_upstream_started_as_a_command_speaks_over_stdio(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    """A local MCP server (the tracker over stdio) behind the gateway; its mapped tool undone by
    a Webhook function, since the operator cannot reach a process of the gateway's."""
    config = {
        "namespace": namespace,
        "upstreams": {"local": {"command": [sys.executable, "-m", "tests.support.mcp_tracker"]}},
        "tools": {"local.create_issue": {"compensation": {"function": "reopen", "args": {"n": "${output.number}"}}}},
    }
    gateway = GatewayProcess(cluster.kubeconfig, config, tmp_path)
    try:
        async with Client(gateway.url, mode="legacy") as agent:
            opened = await agent.call_tool("create_issue", {"title": "one"})
            assert opened.structured_content == {"number": 1}
            listed = await agent.call_tool("list_issues", {})
            assert listed.content[0].text == "#1 open"  # type: ignore[union-attr]
            status = await agent.call_tool("undolog_status", {})
            assert "create_issue-1 → reopen" in status.content[0].text  # type: ignore[union-attr]
            await agent.call_tool("undolog_commit", {})
    finally:
        gateway.stop()


@pytest.mark.usefixtures("operator")
async def test_a_gateway_killed_while_a_call_is_upstream_leaves_its_saga_to_the_operator(
    cluster: Cluster, kube: Kube, namespace: str, tracker: Tracker, tmp_path: Path
) -> None:
    """kill -9 between the entry's creation and the upstream's answer: the issue was opened, the
    gateway never learnt so. Past the session's deadline the operator aborts the saga and undoes
    the call, whose effect may have happened, with what its arguments say (no output came back)."""
    undo_webhook = webhook("tracker.close-issues-titled", url=tracker.url, mcp={"tool": "close_issues_titled"})
    await kube.create("webhooks", namespace, undo_webhook)
    undo = {"tool": "tracker.close_issues_titled", "args": {"title": "${args.title}"}}
    tools = {"tracker.create_issue": {"compensation": undo}}
    config = gateway_config(namespace, tracker, deadline_seconds=5, tools=tools)
    gateway = GatewayProcess(cluster.kubeconfig, config, tmp_path)
    tracker.issues.answer.clear()
    try:
        async with Client(gateway.url, mode="legacy") as agent:
            calling = asyncio.create_task(agent.call_tool("create_issue", {"title": "held"}))
            await eventually(lambda: opened(tracker), bool, 10, "the issue opened upstream")
            name = await only_saga(kube, namespace)
            [entry] = await kube.list("undoentries", namespace)  # written before the call
            # Marked Executing once the call has been out IN_FLIGHT_MARK_AFTER, for people watching.
            await eventually(lambda: effect_of(kube, entry), lambda e: e == "Executing", 10, "marked in flight")
            gateway.process.kill()
            gateway.process.wait(10)
            calling.cancel()
    except* (httpx.HTTPError, MCPError, asyncio.CancelledError):
        pass  # the agent's connection went with the gateway
    finally:
        tracker.issues.answer.set()
        gateway.log.close()
    saga = await saga_phase(kube, namespace, name, "Compensated", within=60)
    print(f"\nsaga {name}: {saga['status']['phase']}, {saga['status'].get('message')}")
    assert tracker.issues.state(1) == "closed"
    [close] = tracker.issues.closes
    assert close.meta_key == f"undo-{entry['spec']['undoId']}"


async def effect_of(kube: Kube, entry: Body) -> str:
    metadata = entry["metadata"]
    read = await kube.get("undoentries", metadata["namespace"], metadata["name"])
    return str(read.get("status", {}).get("effect", "Pending"))  # no status yet: created, effect Pending


async def opened(tracker: Tracker) -> bool:
    return bool(tracker.issues.opened)


@pytest.mark.usefixtures("operator")
async def test_what_a_stdio_server_logs_reaches_only_the_agent_request_it_serves(
    cluster: Cluster, kube: Kube, namespace: str, tmp_path: Path
) -> None:
    """One stdio server, one connection: agent B's call is in flight on it alone, then beside
    the operator's undo of agent A's step. B hears what the server said while only B's call was
    out, never what it said during the undo (nor what cannot be told apart then); A hears nothing."""
    from tests.cluster.test_mcp_catalog import serving_operator_calls

    chatty = {"command": [sys.executable, "-m", "tests.support.mcp_chatty"]}
    tools = {"chatty.make": {"compensation": {"tool": "chatty.unmake", "args": {"name": "${args.name}"}}}}
    gateway = await serving_operator_calls(
        cluster.kubeconfig, kube, namespace, tmp_path, {"upstreams": {"chatty": chatty}, "tools": tools}
    )
    heard: dict[str, list[str]] = {"a": [], "b": []}

    def hearing(agent: str) -> Any:
        async def logged(params: types.LoggingMessageNotificationParams) -> None:
            heard[agent].append(str(params.data))

        return logged

    try:
        async with (
            Client(gateway.url, mode="legacy", logging_callback=hearing("a")) as a,
            Client(gateway.url, mode="legacy", logging_callback=hearing("b")) as b,
        ):
            await a.call_tool("make", {"name": "x"})
            working = asyncio.create_task(b.call_tool("work", {}))
            await eventually(lambda: asyncio.sleep(0, heard["b"]), bool, 10, "B's call logging alone")
            await a.call_tool("undolog_abort", {"reason": "undo x beside B's work"})
            worked = await asyncio.wait_for(working, 60)
        assert worked.content[0].text == "worked beside the undo"  # type: ignore[union-attr]
        await saga_phase(kube, namespace, await only_saga(kube, namespace), "Compensated")
    finally:
        gateway.stop()
    print(f"\nheard: {heard}")
    assert heard == {"a": [], "b": ["work: alone"]}


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_an_upstream_s_json_rpc_refusal_reaches_the_agent_and_the_entry_in_its_own_words(
    kube: Kube, namespace: str, tracker: Tracker, gateway: GatewayProcess, mode: str
) -> None:
    """A mapped tool whose server refuses with a JSON-RPC error: the agent gets that error (its
    code and message), and the step's entry says the same, not the client's exception group."""
    async with Client(gateway.url, mode=mode) as agent:
        with pytest.raises(MCPError) as refused:
            await agent.call_tool("create_issue", {"title": "refused: freeze"})
    said = "no issue titled 'refused: freeze' may be opened: the board is frozen"
    assert (refused.value.code, refused.value.error.message) == (-32602, said)
    entries = await eventually(
        lambda: kube.list("undoentries", namespace), lambda found: len(found) == 1, 10, "the step's entry"
    )
    assert entries[0]["status"]["effect"] == "Failed"
    assert said in entries[0]["status"]["lastError"], entries[0]["status"]["lastError"]


@pytest.mark.usefixtures("operator")
async def test_a_call_not_answered_within_its_upstream_s_call_seconds_fails_and_is_undone(
    cluster: Cluster, kube: Kube, namespace: str, tracker: Tracker, tmp_path: Path
) -> None:
    """The issue is opened upstream and the answer never comes: past the upstream's callSeconds
    the agent gets an error naming the setting, the step is recorded failed (its effect may have
    happened), and the session's end undoes it with what its arguments say."""
    undo_webhook = webhook("tracker.close-issues-titled", url=tracker.url, mcp={"tool": "close_issues_titled"})
    await kube.create("webhooks", namespace, undo_webhook)
    undo = {"tool": "tracker.close_issues_titled", "args": {"title": "${args.title}"}}
    config = gateway_config(namespace, tracker, tools={"tracker.create_issue": {"compensation": undo}})
    config["upstreams"]["tracker"]["callSeconds"] = 2
    gateway = GatewayProcess(cluster.kubeconfig, config, tmp_path)
    tracker.issues.answer.clear()
    try:
        with anyio.fail_after(30):
            async with Client(gateway.url, mode="legacy") as agent:
                with pytest.raises(MCPError) as stopped:
                    await agent.call_tool("create_issue", {"title": "held"})
                name = await only_saga(kube, namespace)
    finally:
        tracker.issues.answer.set()
        gateway.stop()
    said = "upstream tracker did not answer create_issue within 2 s"
    assert said in stopped.value.error.message
    assert "upstreams.tracker.callSeconds" in stopped.value.error.message
    [entry] = await kube.list("undoentries", namespace)
    assert entry["status"]["effect"] == "Failed", entry["status"]
    assert said in entry["status"]["lastError"], entry["status"]
    await saga_phase(kube, namespace, name, "Compensated", within=60)
    assert tracker.issues.state(1) == "closed"
    [close] = tracker.issues.closes
    assert close.meta_key == f"undo-{entry['spec']['undoId']}"
