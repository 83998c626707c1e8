"""Undo for today's MCP agents: the stateless revision (2026-07-28), which the `mcp` package's
`Client(url)` speaks by default. No session: a mapped call without a saga handle opens a saga,
its result carries the handle, and the agent passes it back (`undolog_saga`) to add steps,
abort, rewind or commit. What the handle stands for is in the ledger, so any replica of the
gateway serves any request."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import mcp_types as types
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from tests.cluster.test_mcp_gateway import AGENT, close_issue_webhook, only_saga, tracker  # noqa: F401 (fixtures)
from tests.conftest import Cluster
from tests.support.gateway_process import GatewayProcess, gateway_config
from tests.support.mcp_tracker import Tracker
from tests.support.round_robin import RoundRobin
from tests.support.waiting import saga_phase
from undolog.conventions import forward_key
from undolog.kube import Kube

pytestmark = pytest.mark.cluster
HANDLE = "undolog_saga"


@pytest.fixture
def gateway(cluster: Cluster, namespace: str, tracker: Tracker, tmp_path: Path) -> Iterator[GatewayProcess]:  # noqa: F811
    process = GatewayProcess(cluster.kubeconfig, gateway_config(namespace, tracker), tmp_path)
    yield process
    process.stop()


def handle_of(result: types.CallToolResult) -> str:
    assert result.meta is not None, result
    handle = result.meta["io.undolog/saga-handle"]
    assert isinstance(handle, str)
    said = " ".join(c.text for c in result.content if isinstance(c, types.TextContent))
    assert handle in said, said  # the model reads it too
    return handle


def text(result: types.CallToolResult) -> str:
    return " ".join(c.text for c in result.content if isinstance(c, types.TextContent))


async def three_issues(agent: Client) -> str:
    """Three mapped calls in one saga: the first opens it, the others carry its handle."""
    first = await agent.call_tool("create_issue", {"title": "one"})
    handle = handle_of(first)
    for title in ("two", "three"):
        later = await agent.call_tool("create_issue", {"title": title, HANDLE: handle})
        assert not later.is_error, later
        assert handle_of(later) == handle
    return handle


@pytest.mark.usefixtures("close_issue_webhook", "operator")
async def test_today_s_python_client_with_its_defaults_is_undone_newest_first_through_its_handle(
    kube: Kube,
    namespace: str,
    tracker: Tracker,  # noqa: F811
    gateway: GatewayProcess,
) -> None:
    async with Client(gateway.url) as agent:  # mode="auto": the stateless revision, as the gateway offers it
        tools = {tool.name: tool for tool in (await agent.list_tools()).tools}
        assert HANDLE in tools["create_issue"].input_schema["properties"]
        assert HANDLE not in tools["list_issues"].input_schema.get("properties", {})  # read-only: no saga
        handle = await three_issues(agent)
        assert (await agent.call_tool("list_issues", {HANDLE: handle})).content  # passed, its handle removed
        said = text(await agent.call_tool("undolog_abort", {HANDLE: handle, "reason": "changed my mind"}))
        print(f"\n{said}")
        assert said.index("create_issue-3") < said.index("create_issue-2") < said.index("create_issue-1")
    async with httpx.AsyncClient() as http:
        scraped = (await http.get(f"{gateway.base}/metrics", timeout=5)).text
    assert 'undolog_gateway_sessions_total{outcome="aborted"} 1.0' in scraped  # counted as a session's would be
    name = await only_saga(kube, namespace)
    await saga_phase(kube, namespace, name, "Compensated")
    assert [close.number for close in tracker.issues.closes] == [3, 2, 1]
    assert all("undolog_saga" not in issue for issue in tracker.issues.opened.values())


@pytest.mark.usefixtures("close_issue_webhook", "operator")
async def test_a_stateless_agent_rewinds_through_its_handle_and_carries_on_in_the_same_saga(
    kube: Kube,
    namespace: str,
    tracker: Tracker,  # noqa: F811
    gateway: GatewayProcess,
) -> None:
    async with Client(gateway.url) as agent:
        handle = await three_issues(agent)
        rewound = await agent.call_tool("undolog_rewind", {HANDLE: handle, "to_step": "create_issue-1", "reason": "x"})
        assert not rewound.is_error, text(rewound)
        assert [close.number for close in tracker.issues.closes] == [3, 2]
        again = await agent.call_tool("create_issue", {"title": "four", HANDLE: handle})
        assert again.meta is not None
        assert again.meta["io.undolog/step"] == "create_issue-4"
        assert not (await agent.call_tool("undolog_commit", {HANDLE: handle})).is_error
    name = await only_saga(kube, namespace)
    done = await saga_phase(kube, namespace, name, "Completed")
    assert done["status"]["stackDepth"] == 4


async def refused(agent: Client, arguments: dict[str, Any], said: str) -> None:
    with pytest.raises(MCPError, match=said):
        await agent.call_tool("create_issue", {"title": "never", **arguments})


@pytest.mark.usefixtures("close_issue_webhook", "operator")
async def test_a_forged_malformed_foreign_or_finished_handle_is_refused_and_nothing_is_called(
    cluster: Cluster,
    kube: Kube,
    namespace: str,
    tracker: Tracker,  # noqa: F811
    gateway: GatewayProcess,
    tmp_path: Path,
) -> None:
    other = GatewayProcess(cluster.kubeconfig, gateway_config(namespace, tracker), tmp_path, handle_key="another key")
    try:
        async with Client(other.url) as elsewhere:
            foreign = handle_of(await elsewhere.call_tool("create_issue", {"title": "theirs"}))
    finally:
        other.stop()
    async with Client(gateway.url) as agent:
        mine = await agent.call_tool("create_issue", {"title": "mine"})
        handle = handle_of(mine)
        assert mine.meta is not None
        name = str(mine.meta["io.undolog/saga"]).split("/")[1]
        opened = dict(tracker.issues.opened)
        prefix, payload, mac = handle.split(".")
        await refused(agent, {HANDLE: f"{prefix}.{payload}.{mac[:-2]}AA"}, "not signed by this gateway's key")
        await refused(agent, {HANDLE: foreign}, "not signed by this gateway's key")
        await refused(agent, {HANDLE: "mcp-x7k2p"}, "is not a saga handle this gateway minted")
        await refused(agent, {HANDLE: f"{prefix}.bm90IGpzb24.{mac}"}, "not signed")
        assert not (await agent.call_tool("undolog_commit", {HANDLE: handle})).is_error
        await saga_phase(kube, namespace, name, "Completed")
        await refused(agent, {HANDLE: handle}, "Completed.*call without it to start a new saga. Nothing was called")
        assert tracker.issues.opened == opened  # nothing reached the tracker


@pytest.mark.usefixtures("close_issue_webhook", "operator")
async def test_two_replicas_behind_a_round_robin_proxy_serve_one_saga_through_a_kill(
    cluster: Cluster,
    kube: Kube,
    namespace: str,
    tracker: Tracker,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Nothing of a saga lives in a gateway: one replica killed mid-saga, the agent carries on
    through the other, and the abort undoes every step."""
    config = gateway_config(namespace, tracker)
    replicas = [GatewayProcess(cluster.kubeconfig, config, tmp_path) for _ in range(2)]
    proxy: RoundRobin | None = None
    try:
        proxy = RoundRobin([r.base for r in replicas])
        async with Client(proxy.url) as agent:
            handle = handle_of(await agent.call_tool("create_issue", {"title": "one"}))
            await agent.call_tool("create_issue", {"title": "two", HANDLE: handle})
            assert {replicas[0].base, replicas[1].base} <= set(proxy.served)  # both took part
            replicas[0].kill()
            for title in ("three", "four"):
                assert not (await agent.call_tool("create_issue", {"title": title, HANDLE: handle})).is_error
            said = text(await agent.call_tool("undolog_abort", {HANDLE: handle, "reason": "done testing"}))
            assert "create_issue-4" in said
    finally:
        if proxy is not None:
            proxy.stop()
        for replica in replicas:
            if replica.process.poll() is None:
                replica.stop()
    name = await only_saga(kube, namespace)
    compensated = await saga_phase(kube, namespace, name, "Compensated")
    assert compensated["status"]["stackDepth"] == 4
    assert [close.number for close in tracker.issues.closes] == [4, 3, 2, 1]


@pytest.mark.usefixtures("close_issue_webhook", "operator")
async def test_a_typescript_agent_on_the_sdk_s_current_major_is_undone_through_its_handle(
    kube: Kube,
    namespace: str,
    tracker: Tracker,  # noqa: F811
    gateway: GatewayProcess,
) -> None:
    node = shutil.which("node")
    assert node is not None, "node is on the machine (make test installs the agent's packages with npm)"
    ran = subprocess.run(  # noqa: ASYNC221 - the agent is a process of its own; nothing else runs meanwhile
        [node, str(AGENT / "agent2026.mjs"), gateway.url, "abort-after-three"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    lines = [json.loads(line) for line in ran.stdout.splitlines()]
    print("\n" + "\n".join(json.dumps(line)[:200] for line in lines))
    assert lines[0] == {"protocol": "2026-07-28"}
    calls = [line for line in lines if "name" in line]
    handles = {c["meta"].get("io.undolog/saga-handle") for c in calls if c["name"] == "create_issue"}
    assert len(handles) == 1  # one saga, carried by its handle
    assert None not in handles
    name = await only_saga(kube, namespace)
    await saga_phase(kube, namespace, name, "Compensated")
    assert [close.number for close in tracker.issues.closes] == [3, 2, 1]


def confirming(answer: str, asked: list[str]) -> Any:
    """An agent's elicitation callback: records the question and gives `answer`."""

    async def callback(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action=answer)

    return callback


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_a_person_is_asked_before_what_cannot_be_undone_and_a_declined_call_is_not_made(
    cluster: Cluster,
    kube: Kube,
    namespace: str,
    tracker: Tracker,  # noqa: F811
    tmp_path: Path,
    mode: str,
) -> None:
    """`label_issue` cannot be undone: with confirm: true the user is asked (an input_required
    result on the stateless revision, elicitation on a session); declined, it is not called;
    accepted, it is. Both answers are recorded on the saga."""
    config = gateway_config(namespace, tracker)
    config["tools"]["tracker.label_issue"] = {"confirm": True}
    gateway = GatewayProcess(cluster.kubeconfig, config, tmp_path)
    try:
        asked: list[str] = []
        handle: dict[str, Any] = {}
        for answer in ("decline", "accept"):
            async with Client(gateway.url, mode=mode, elicitation_callback=confirming(answer, asked)) as agent:
                if "issue" not in handle:
                    opened = await agent.call_tool("create_issue", {"title": "one"})
                    handle["issue"] = opened.meta.get("io.undolog/saga-handle") if opened.meta else None
                extra = {HANDLE: handle["issue"]} if handle["issue"] else {}
                result = await agent.call_tool("label_issue", {"number": 1, "label": answer, **extra})
                assert result.is_error == (answer == "decline"), text(result)
        assert len(asked) == 2
        assert "UndoLog cannot undo this call" in asked[0]
        assert tracker.issues.opened[1].get("labels") == ["accept"]  # the declined label never reached it
        sagas = await kube.list("sagas", namespace)
        recorded = sorted(
            json.loads(v)["answer"]
            for s in sagas
            for k, v in s["metadata"].get("annotations", {}).items()
            if k.startswith("undolog.io/confirmation-")
        )
        print(f"\n{mode}: asked {asked[0][:80]}...; recorded {recorded}")
        assert recorded == ["accept", "decline"]
        # Counted refused while the user is asked (each question on the stateless revision) or says no.
        async with httpx.AsyncClient() as http:
            scraped = (await http.get(f"http://127.0.0.1:{gateway.port}/metrics", timeout=5)).text
        refused = 3 if mode == "auto" else 1
        assert (
            f'undolog_gateway_tool_calls_total{{outcome="refused",tool="tracker.label_issue"}} {refused}.0' in scraped
        )
        assert 'undolog_gateway_tool_calls_total{outcome="registered",tool="tracker.label_issue"} 1.0' in scraped
    finally:
        gateway.stop()


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_resources_templates_and_prompts_pass_through_in_both_eras(
    tracker: Tracker,  # noqa: F811
    gateway: GatewayProcess,
    mode: str,
) -> None:
    async with Client(gateway.url, mode=mode) as agent:
        listed = await agent.list_resources()
        assert [str(r.uri) for r in listed.resources] == ["tracker://about"]
        read = await agent.read_resource("tracker://about")
        assert read.contents[0].text == "a small issue tracker for UndoLog's tests"  # type: ignore[union-attr]
        templates = await agent.list_resource_templates()
        assert [t.uri_template for t in templates.resource_templates] == ["tracker://issues/{number}"]
        assert "no issue #7" in (await agent.read_resource("tracker://issues/7")).contents[0].text  # type: ignore[union-attr]
        prompts = await agent.list_prompts()
        assert [p.name for p in prompts.prompts] == ["triage"]
        got = await agent.get_prompt("triage", {"number": "3"})
        assert "Triage issue #3" in got.messages[0].content.text  # type: ignore[union-attr]


def naming(who: str, asked: list[str]) -> Any:
    """An agent's elicitation callback: allows what UndoLog asks about, names `who` for the server."""

    async def callback(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        if "UndoLog cannot undo" in params.message:
            return types.ElicitResult(action="accept")
        return types.ElicitResult(action="accept", content={"name": who})

    return callback


async def assigned(gateway: GatewayProcess, mode: str, asked: list[str], undo: bool) -> types.CallToolResult:
    """create_assigned_issue called once by the agent (its SDK answers the server's questions),
    then its saga aborted (undo) or committed."""
    async with Client(gateway.url, mode=mode, elicitation_callback=naming("ada", asked)) as agent:
        result = await agent.call_tool("create_assigned_issue", {"title": "owned"})
        assert not result.is_error, text(result)
        extra = {HANDLE: handle_of(result)} if mode == "auto" else {}
        ended = await agent.call_tool("undolog_abort" if undo else "undolog_commit", extra)
        assert not ended.is_error, text(ended)
    return result


@pytest.mark.usefixtures("close_issue_webhook", "operator")
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_a_server_s_question_reaches_the_agent_and_the_answered_call_is_one_step_undone_on_abort(
    cluster: Cluster,
    kube: Kube,
    namespace: str,
    tracker: Tracker,  # noqa: F811
    tmp_path: Path,
    mode: str,
) -> None:
    """create_assigned_issue asks who owns the issue before it opens one. On 2026-07-28 its
    input_required result reaches the agent as it came, and the agent's retry (its answer, and
    the requestState naming the step left open) is recorded on that step, under the same
    Idempotency-Key, in the saga the first round opened; on a session the question is
    elicitation mid-call. Either way: one step, one issue, closed on abort."""
    config = gateway_config(namespace, tracker)
    close = {"tool": "tracker.close_issue", "args": {"number": "${output.number}"}}
    config["tools"]["tracker.create_assigned_issue"] = {"compensation": close}
    gateway = GatewayProcess(cluster.kubeconfig, config, tmp_path)
    asked: list[str] = []
    try:
        result = await assigned(gateway, mode, asked, undo=True)
    finally:
        gateway.stop()
    assert result.meta is not None
    assert result.meta["io.undolog/step"] == "create_assigned_issue-1"
    assert asked == ["Who should own this issue?"]
    assert [(n, i["assignee"]) for n, i in tracker.issues.opened.items()] == [(1, "ada")]
    name = await only_saga(kube, namespace)
    await saga_phase(kube, namespace, name, "Compensated")
    entries = await kube.list("undoentries", namespace)
    assert [(e["spec"]["step"], e["status"]["effect"]) for e in entries] == [("create_assigned_issue-1", "Committed")]
    assert [c.number for c in tracker.issues.closes] == [1]
    uid = entries[0]["metadata"]["ownerReferences"][0]["uid"]
    assert tracker.issues.created_keys == [forward_key(uid, "create_assigned_issue-1")]


@pytest.mark.usefixtures("operator")
async def test_a_call_the_user_allowed_is_not_asked_about_again_when_its_server_asks_a_question(
    cluster: Cluster,
    kube: Kube,
    namespace: str,
    tracker: Tracker,  # noqa: F811
    tmp_path: Path,
) -> None:
    """confirm: true, then the server's own question: the user allows the call once (recorded
    once), the retry that answers the server carries that on, and a requestState altered by the
    agent is refused with nothing called."""
    config = gateway_config(namespace, tracker)
    config["tools"]["tracker.create_assigned_issue"] = {"confirm": True}
    gateway = GatewayProcess(cluster.kubeconfig, config, tmp_path)
    asked: list[str] = []
    try:
        await assigned(gateway, "auto", asked, undo=False)
        async with Client(gateway.url) as agent:
            first = await agent.session.call_tool(
                "create_assigned_issue", {"title": "forged"}, allow_input_required=True
            )
            assert isinstance(first, types.InputRequiredResult)  # UndoLog asks first: no state of its own yet
            with pytest.raises(MCPError, match="requestState is not signed by this gateway's key"):
                await agent.session.call_tool(
                    "create_assigned_issue",
                    {"title": "forged"},
                    request_state="ulr1.e30.forged",
                    allow_input_required=True,
                )
    finally:
        gateway.stop()
    assert len(asked) == 2
    assert "UndoLog cannot undo" in asked[0]
    assert asked[1] == "Who should own this issue?"
    assert [i["title"] for i in tracker.issues.opened.values()] == ["owned"]
    sagas = await kube.list("sagas", namespace)
    recorded = [
        json.loads(v)["answer"]
        for s in sagas
        for k, v in s["metadata"].get("annotations", {}).items()
        if k.startswith("undolog.io/confirmation-")
    ]
    assert recorded == ["accept"]
