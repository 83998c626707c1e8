"""Long-running tool calls (MCP's tasks extension) through the gateway: a mapped tool answered
with a task is one step whose effect is unknown until the task ends. Its entry stays open and
names the task; the outcome is recorded when the task ends; an abort cancels the saga's running
tasks first, and compensates a step only if its task completed (or its end was not seen). The
upstream is the tests' conformance server, whose counter's increment runs as a task."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from mcp import Client

from tests.conftest import Cluster
from tests.support import conformance_suite
from tests.support.gateway_process import GatewayProcess
from tests.support.manifests import webhook
from tests.support.waiting import eventually, saga_phase
from undolog.gateway.task_wire import Passed, TaskCreated, TaskParams, TaskRequest, TasksClient
from undolog.kube import Kube

pytestmark = pytest.mark.cluster
HANDLE = "undolog_saga"
UNDO = {"compensation": {"tool": "everything.decrement", "args": {"name": "${args.name}"}}}


@pytest.fixture
def upstream(tmp_path: Path) -> Iterator[str]:
    with conformance_suite.upstream(tmp_path) as url:
        yield url


@pytest_asyncio.fixture
async def gateway(cluster: Cluster, kube: Kube, namespace: str, upstream: str, tmp_path: Path) -> AsyncIterator[str]:
    await kube.create("webhooks", namespace, webhook("everything.decrement", url=upstream, mcp={"tool": "decrement"}))
    tools = {
        "everything.slow_increment": UNDO,
        "everything.ask_then_increment": UNDO,
        "everything.stubborn_increment": UNDO,
    }
    config = {
        "namespace": namespace,
        "unmapped": "pass",
        "upstreams": {"everything": {"url": upstream}},
        "tools": tools,
    }
    process = GatewayProcess(cluster.kubeconfig, config, tmp_path)
    yield process.url
    process.stop()


async def task_said(agent: Client, method: str, task_id: str, **fields: Any) -> dict[str, Any]:
    params = TaskParams.model_validate({"taskId": task_id, **fields})
    answer = await agent.session.send_request(TaskRequest(method=method, params=params), Passed)
    return answer.model_dump(by_alias=True, exclude_none=True)


async def started(agent: Client, tool: str, arguments: dict[str, Any]) -> tuple[TaskCreated, str]:
    """The mapped call answered with a task: the task, and the saga's handle."""
    created = await agent.session.call_tool(tool, arguments, allow_claimed=True)
    assert isinstance(created, TaskCreated), created
    assert created.meta is not None
    return created, str(created.meta["io.undolog/saga-handle"])


async def counter(upstream: str, name: str) -> dict[str, int]:
    async with Client(upstream, mode="legacy") as direct:
        said = await direct.call_tool("read_counter", {"name": name})
    assert said.structured_content is not None
    return {"value": int(said.structured_content["value"]), "decrements": int(said.structured_content["decrements"])}


async def entry_of(kube: Kube, namespace: str) -> dict[str, Any]:
    listed = await kube.list("undoentries", namespace)
    assert len(listed) == 1, listed
    return listed[0]


@pytest.mark.usefixtures("operator")
async def test_aborted_while_its_task_runs_the_task_is_cancelled_and_nothing_is_undone(
    kube: Kube, namespace: str, gateway: str, upstream: str
) -> None:
    async with Client(gateway, extensions=[TasksClient()]) as agent:
        created, handle = await started(agent, "slow_increment", {"name": "running", "seconds": 60})
        assert created.task_id.startswith("ult1.")  # the gateway's, naming the upstream's
        entry = await entry_of(kube, namespace)
        assert entry["status"]["effect"] == "Executing"
        assert entry["status"]["task"]["upstream"] == "everything"
        said = await agent.call_tool("undolog_abort", {HANDLE: handle, "reason": "stop it"})
        assert not said.is_error, said
        ended = await task_said(agent, "tasks/get", created.task_id)
    assert ended["status"] == "cancelled"
    saga = str((await entry_of(kube, namespace))["spec"]["saga"])
    await saga_phase(kube, namespace, saga, "Compensated")
    entry = await entry_of(kube, namespace)
    assert (entry["status"]["effect"], entry["status"]["reason"]) == ("Abandoned", "TaskEnded")
    assert await counter(upstream, "running") == {"value": 0, "decrements": 0}  # nothing done, nothing undone


@pytest.mark.usefixtures("operator")
async def test_an_abort_cancels_the_saga_s_running_tasks_together(
    kube: Kube, namespace: str, gateway: str, upstream: str
) -> None:
    """The server answers a cancel only once its task has ended (after `seconds`): the abort
    sends every cancel at once, so it waits for the slowest task, never for each in turn (with
    tasks that do not end, SETTLE_SECONDS each). Both ended completed: both compensated."""
    async with Client(gateway, extensions=[TasksClient()]) as agent:
        _, handle = await started(agent, "stubborn_increment", {"name": "stubborn", "seconds": 6})
        arguments = {"name": "stubborn", "seconds": 6, HANDLE: handle}
        second = await agent.session.call_tool("stubborn_increment", arguments, allow_claimed=True)
        assert isinstance(second, TaskCreated), second
        said = await agent.call_tool("undolog_abort", {HANDLE: handle, "reason": "stop both"})
        assert not said.is_error, said
    async with Client(upstream, mode="legacy") as direct:
        cancels = await direct.call_tool("read_cancels", {})
    assert cancels.structured_content == {"most_at_once": 2}
    saga = str((await kube.list("undoentries", namespace))[0]["spec"]["saga"])
    await saga_phase(kube, namespace, saga, "Compensated")
    assert await counter(upstream, "stubborn") == {"value": 0, "decrements": 2}


@pytest.mark.usefixtures("operator")
@pytest.mark.parametrize("polled", [True, False])
async def test_aborted_after_its_task_completed_the_step_is_compensated_once(
    kube: Kube, namespace: str, gateway: str, upstream: str, polled: bool
) -> None:
    """Whether the agent saw the task end (its tasks/get records the outcome) or not (the abort
    asks the server, finds it completed, and records it)."""
    async with Client(gateway, extensions=[TasksClient()]) as agent:
        created, handle = await started(agent, "slow_increment", {"name": "done", "seconds": 0.2})

        async def increments() -> dict[str, int]:
            return await counter(upstream, "done")

        await eventually(increments, lambda c: c["value"] == 1, 10, "the task's increment")
        if polled:
            said = await task_said(agent, "tasks/get", created.task_id)
            assert said["status"] == "completed"
            assert (await entry_of(kube, namespace))["status"]["effect"] == "Committed"
        await agent.call_tool("undolog_abort", {HANDLE: handle, "reason": "undo it"})
    saga = str((await entry_of(kube, namespace))["spec"]["saga"])
    await saga_phase(kube, namespace, saga, "Compensated")
    assert (await entry_of(kube, namespace))["status"]["effect"] == "Committed"
    assert await counter(upstream, "done") == {"value": 0, "decrements": 1}


@pytest.mark.usefixtures("operator")
async def test_a_task_that_asks_the_user_is_answered_through_the_gateway(
    kube: Kube, namespace: str, gateway: str, upstream: str
) -> None:
    async with Client(gateway, extensions=[TasksClient()]) as agent:
        created, handle = await started(agent, "ask_then_increment", {"name": "asked"})

        async def state() -> dict[str, Any]:
            return await task_said(agent, "tasks/get", created.task_id)

        asking = await eventually(state, lambda s: s["status"] == "input_required", 10, "the task's question")
        assert list(asking["inputRequests"]) == ["confirm"]
        answer = {"confirm": {"action": "accept", "content": {"confirm": True}}}
        acked = await task_said(agent, "tasks/update", created.task_id, inputResponses=answer)
        assert acked["resultType"] == "complete"
        assert "status" not in acked  # an ack: the task's state is told by the next tasks/get
        done = await eventually(state, lambda s: s["status"] == "completed", 10, "the task's end")
        assert "asked is 1" in str(done["result"])
        assert (await entry_of(kube, namespace))["status"]["effect"] == "Committed"
        await agent.call_tool("undolog_abort", {HANDLE: handle, "reason": "undo the answered one"})
    saga = str((await entry_of(kube, namespace))["spec"]["saga"])
    await saga_phase(kube, namespace, saga, "Compensated")
    assert await counter(upstream, "asked") == {"value": 0, "decrements": 1}


async def test_a_forged_task_id_or_an_agent_without_the_extension_reaches_no_task(gateway: str) -> None:
    async with Client(gateway, extensions=[TasksClient()]) as agent:
        created = await agent.session.call_tool("slow_compute", {"seconds": 30}, allow_claimed=True)
        assert isinstance(created, TaskCreated)
        forged = created.task_id[:-4] + "AAAA"
        with pytest.raises(Exception, match="not signed by this gateway's key"):
            await task_said(agent, "tasks/get", forged)
        await task_said(agent, "tasks/cancel", created.task_id)
    async with Client(gateway) as undeclared:  # without the extension, its task surface is refused
        with pytest.raises(Exception, match=r"needs the extension io\.modelcontextprotocol/tasks"):
            await task_said(undeclared, "tasks/get", created.task_id)


@pytest.mark.usefixtures("operator")
async def test_a_task_its_server_no_longer_knows_is_compensated_as_an_unknown_outcome(
    kube: Kube, namespace: str, gateway: str, upstream: str
) -> None:
    """The server refuses the abort's tasks/cancel (it does not know the task: restarted, or
    expired): the abort goes on, and the step, its outcome unknown, is compensated."""
    async with Client(gateway, extensions=[TasksClient()]) as agent:
        _, handle = await started(agent, "slow_increment", {"name": "forgotten", "seconds": 0.2})

        async def increments() -> dict[str, int]:
            return await counter(upstream, "forgotten")

        await eventually(increments, lambda c: c["value"] == 1, 10, "the task's increment")
        entry = await entry_of(kube, namespace)
        gone = {"status": {"task": {"upstream": "everything", "taskId": "task-the-server-forgot"}}}
        await kube.patch_status("undoentries", namespace, entry["metadata"]["name"], gone)
        said = await agent.call_tool("undolog_abort", {HANDLE: handle, "reason": "undo it"})
        assert not said.is_error, said
    saga = str((await entry_of(kube, namespace))["spec"]["saga"])
    await saga_phase(kube, namespace, saga, "Compensated")
    assert (await entry_of(kube, namespace))["status"]["effect"] == "Executing"  # its end never seen
    assert await counter(upstream, "forgotten") == {"value": 0, "decrements": 1}
