"""The tasks extension (`io.modelcontextprotocol/tasks`, SEP-2663) passed through, for stateless
agents (2026-07-28) that declare it on their request: an upstream that answers a tool call with
a task (`resultType: "task"`) has its task handed to the agent under a task id the gateway signs
(the upstream, the server's own id, the caller it was started for: decisions/saga_handles.py),
and the agent's `tasks/get`, `tasks/update` and `tasks/cancel` go to that upstream, from that
caller only, with the server's answer passed back as it came.

A mapped call answered with a task is a step whose outcome is unknown until the task ends: its
UndoEntry stays open (status.task names the task), and the outcome is recorded when the gateway
sees the task end (an agent's tasks/get, or an abort). An abort of the saga first asks the
server to cancel the saga's tasks still running and waits for their end (at most
SETTLE_SECONDS): a task that ended cancelled or failed did nothing, by its server's word, and is
not compensated; one that completed, or whose end was not seen, is."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError

from undolog.api import EntryTask
from undolog.decisions import saga_handles
from undolog.decisions.saga_handles import HandleRefusal, UpstreamTask
from undolog.errors import SagaEnded
from undolog.gateway import agent_requests
from undolog.gateway.agent_requests import TASKS, AgentRequest, OperatorRequest, Requester
from undolog.gateway.task_wire import Passed, TaskCreated, TaskParams, TaskRequest
from undolog.gateway.upstreams import Upstreams, asked, lone
from undolog.kube import Kube
from undolog.sdk import SagaRun
from undolog.sdk.saga import StepRun, resumed_saga, running_tasks, unrecorded_step

log = logging.getLogger("undolog.gateway")
METHODS = ("tasks/get", "tasks/update", "tasks/cancel")
ENDED = frozenset({"completed", "failed", "cancelled"})
NAME_HEADER, HEADER_MISMATCH = "mcp-name", -32020
SETTLE_SECONDS = 10.0  # an abort waits this long for the tasks it cancels to end
KNOWN_ENDS = 10_000  # task ends remembered, the oldest forgotten first
Recording = Callable[[SagaRun, StepRun, dict[str, Any]], Awaitable[None]]  # a task's end, on its step


def handed(
    key: bytes, request: AgentRequest, upstream: str, created: TaskCreated, step: tuple[SagaRun, int] | None = None
) -> TaskCreated:
    """The task as the agent sees it: under the gateway's id, naming the step it runs (if any)."""
    saga, position = (f"{step[0].namespace}/{step[0].name}", step[1]) if step else (None, None)
    sealed = saga_handles.seal_task(key, UpstreamTask(upstream, created.task_id, saga, position), request.identity)
    return TaskCreated.model_validate({**created.model_dump(by_alias=True, exclude_none=True), "taskId": sealed})


class Tasks:
    def __init__(self, upstreams: Upstreams, kube: Kube, key: bytes, record: Recording) -> None:
        self.upstreams, self.kube, self.key, self.record = upstreams, kube, key, record
        self.ended: OrderedDict[str, None] = OrderedDict()  # tasks whose end this replica recorded

    def install(self, server: Any) -> None:
        server.extensions[TASKS] = {}
        for method in METHODS:
            server.add_request_handler(method, TaskParams, self._handler(method))

    def _handler(self, method: str) -> Any:
        async def handle(ctx: ServerRequestContext[Any], params: TaskParams) -> dict[str, Any]:
            headers = getattr(ctx.request, "headers", None)
            named = headers.get(NAME_HEADER) if headers is not None else None
            if named is not None and named != params.task_id:  # SEP-2243: routing headers match the body
                raise MCPError(HEADER_MISMATCH, f"{method}: the Mcp-Name header is not params.taskId")
            return await self.passed(method, agent_requests.of(ctx), params)

        return handle

    async def passed(self, method: str, request: AgentRequest, params: TaskParams) -> dict[str, Any]:
        """The agent's request of its task, sent to the upstream that runs it; its answer back,
        and the step's outcome recorded once the task has ended."""
        if TASKS not in request.extensions:
            data: dict[str, Any] = {"requiredCapabilities": {"extensions": {TASKS: {}}}}
            raise MCPError(types.MISSING_REQUIRED_CLIENT_CAPABILITY, f"{method} needs the extension {TASKS}", data)
        found = saga_handles.opened_task(self.key, params.task_id, request.identity)
        if isinstance(found, HandleRefusal):
            raise MCPError(types.INVALID_PARAMS, f"{method}: no such task: {found.message}")
        fields = {**params.model_dump(by_alias=True, exclude_none=True), "taskId": found.task_id}
        said = await self._sent(request, found.upstream, method, fields)
        if method == "tasks/get" and said.get("status") in ENDED and found.saga is not None:
            if params.task_id not in self.ended:  # an agent polls on: the ledger is not read again
                await self._ended(found, said)
            self.ended[params.task_id] = None
            while len(self.ended) > KNOWN_ENDS:
                self.ended.popitem(last=False)
        return {**said, "taskId": params.task_id} if "taskId" in said else said

    async def _sent(self, request: Requester, upstream: str, method: str, fields: dict[str, Any]) -> dict[str, Any]:
        sent = TaskRequest(method=method, params=TaskParams.model_validate(fields))
        answer = await asked(
            self.upstreams, request, upstream, lambda c: c.session.send_request(sent, Passed), method, tasks=True
        )
        return answer.model_dump(by_alias=True, exclude_none=True)

    async def _ended(self, found: UpstreamTask, said: dict[str, Any]) -> None:
        """The step the task ran recorded, unless it is recorded already or its saga has ended."""
        assert found.saga is not None
        assert found.position is not None
        namespace, name = found.saga.split("/", 1)
        try:
            run = await resumed_saga(self.kube, namespace, name)
            step = await unrecorded_step(run, found.position)
        except (SagaEnded, ValueError):
            return
        await self.record(run, step, said)

    async def settle_open(self, run: SagaRun) -> None:
        """Before an abort: the saga's tasks still running cancelled together, and the end of
        each, if seen within SETTLE_SECONDS, recorded on its step. Together: a server that
        answers a cancel only once its task ends kept an abort waiting SETTLE_SECONDS per task."""
        running = await running_tasks(run)
        try:
            async with anyio.create_task_group() as settling:
                for step, task in running:
                    settling.start_soon(self._settled, run, step, task)
        except BaseExceptionGroup as group:  # a step's outcome not recorded: said as itself
            raise lone(group) from None

    async def _settled(self, run: SagaRun, step: StepRun, task: EntryTask) -> None:
        try:
            with anyio.fail_after(SETTLE_SECONDS):
                said = await self._cancelled(task)
        except (MCPError, OSError, TimeoutError) as error:
            log.warning("the task of step %s (%s) did not end: compensated as unknown (%s)", step.name, task, error)
            return
        await self.record(run, step, said)

    async def _cancelled(self, task: EntryTask) -> dict[str, Any]:
        operator = OperatorRequest(f"{task.upstream} tasks/cancel")
        await self._sent(operator, task.upstream, "tasks/cancel", {"taskId": task.task_id})
        while True:
            said = await self._sent(operator, task.upstream, "tasks/get", {"taskId": task.task_id})
            if said.get("status") in ENDED:
                return said
            await anyio.sleep(min(max(int(said.get("pollIntervalMs") or 200), 100), 1000) / 1000)
