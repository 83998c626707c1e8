"""The conformance upstream's tasks (the `io.modelcontextprotocol/tasks` extension, SEP-2663),
to the server specification of @modelcontextprotocol/conformance 0.2.0-alpha.12 (its scenarios
`tasks-*`): a tool that may run long answers `tools/call` with a task (`resultType: "task"`),
which the client follows with `tasks/get` (the result inlined once it completes), answers with
`tasks/update` when it asks for input, and ends with `tasks/cancel`. Offered to clients of the
stateless revision that declare the extension on their request."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from pydantic import ConfigDict

TASKS = "io.modelcontextprotocol/tasks"
TTL_MS, POLL_MS = 60_000, 200
HEADER_MISMATCH = -32020  # SEP-2243: a routing header that does not match the body
Ctx = ServerRequestContext[Any]


def _tool(tool: str, description: str, **properties: str) -> types.Tool:
    schema = {"type": "object", "properties": {k: {"type": t} for k, t in properties.items()}}
    return types.Tool(name=tool, description=description, input_schema=schema)


TOOLS = [
    _tool("greet", "Says hello (never a task)", name="string"),
    _tool("slow_compute", "Sleeps `seconds`, then answers (a task)", seconds="number", label="string"),
    _tool("failing_job", "Fails as a tool after a second (a task; needs the extension)"),
    _tool("protocol_error_job", "Fails with a protocol error (a task)"),
    _tool("confirm_delete", "Asks the user to confirm, then deletes (a task)"),
    _tool("multi_input", "Asks two questions at once (a task)"),
    _tool("test_tool_with_task", "Asks a name (input_required), then runs as a task"),
    # UndoLog's own, for its tests of tasks as steps: a counter whose increment runs as a task.
    _tool("slow_increment", "Adds one to a counter after `seconds` (a task)", name="string", seconds="number"),
    _tool("ask_then_increment", "Asks to confirm, then adds one to a counter (a task)", name="string"),
    _tool(
        "stubborn_increment",
        "Adds one to a counter after `seconds` (a task its cancel does not stop: answered once it ends)",
        name="string",
        seconds="number",
    ),
    _tool("read_cancels", "How many tasks/cancel requests were in flight at once, at most"),
    _tool("decrement", "Takes one from a counter", name="string"),
    _tool("read_counter", "A counter, and how many times it was decremented", name="string"),
]
REQUIRED = {"failing_job", "test_tool_with_task"}  # run only as tasks
NAMES = {t.name for t in TOOLS}


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _confirm(message: str) -> dict[str, Any]:
    schema = {"type": "object", "properties": {"confirm": {"type": "boolean"}}, "required": ["confirm"]}
    return {"method": "elicitation/create", "params": {"mode": "form", "message": message, "requestedSchema": schema}}


@dataclass
class Task:
    id: str
    status: str = "working"
    created: str = field(default_factory=_now)
    updated: str = field(default_factory=_now)
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    asking: dict[str, Any] = field(default_factory=dict)  # inputRequests still unanswered
    answered: asyncio.Event = field(default_factory=asyncio.Event)
    runner: asyncio.Task[None] | None = None

    def wire(self) -> dict[str, Any]:
        return {
            "taskId": self.id,
            "status": self.status,
            "createdAt": self.created,
            "lastUpdatedAt": self.updated,
            "ttlMs": TTL_MS,
            "pollIntervalMs": POLL_MS,
        }

    def ended(self, status: str, result: dict[str, Any] | None = None, error: dict[str, Any] | None = None) -> None:
        if self.status in ("completed", "failed", "cancelled"):
            return
        self.status, self.result, self.error, self.updated = status, result, error, _now()


class TaskParams(types.RequestParams):
    model_config = ConfigDict(extra="allow")
    task_id: str
    input_responses: dict[str, Any] | None = None


class Tasks:
    def __init__(self) -> None:
        self.tasks: dict[str, Task] = {}
        self.ids = itertools.count(1)
        self.counters: dict[str, int] = {}
        self.decrements: dict[str, int] = {}
        self.cancelling = self.most_cancelling = 0  # tasks/cancel requests in flight, now and at most

    def install(self, server: Any) -> None:
        server.extensions[TASKS] = {}
        server.add_request_handler("tasks/get", TaskParams, self.get)
        server.add_request_handler("tasks/update", TaskParams, self.update)
        server.add_request_handler("tasks/cancel", TaskParams, self.cancel)

    async def call(self, ctx: Ctx, params: types.CallToolRequestParams) -> dict[str, Any] | types.CallToolResult:
        """A tool of TOOLS: a task when the request declared the extension, else run to its end
        (or refused, for a tool that needs the extension)."""
        name, args = params.name, dict(params.arguments or {})
        if name == "greet":
            return _text(f"Hello, {args.get('name', 'World')}!")
        if name in ("decrement", "read_counter"):
            return self._counted(name, str(args.get("name")))
        if name == "read_cancels":
            said = _text(f"{self.most_cancelling} at once at most")
            said.structured_content = {"most_at_once": self.most_cancelling}
            return said
        if not _declared(ctx):
            if name in REQUIRED:
                data: dict[str, Any] = {"requiredCapabilities": {"extensions": {TASKS: {}}}}
                raise MCPError(types.MISSING_REQUIRED_CLIENT_CAPABILITY, f"{name} runs only as a task", data)
            task = Task("sync")
            await self._run(task, name, args)
            if task.error is not None:
                raise MCPError(task.error["code"], task.error["message"])
            return types.CallToolResult.model_validate(task.result or {})
        if name == "test_tool_with_task" and not params.input_responses:
            return {
                "resultType": "input_required",
                "inputRequests": {"user_name": _named()},
                "requestState": "asked-name",
            }
        if name == "test_tool_with_task":
            answer = (params.input_responses or {}).get("user_name")
            args["user_name"] = _answered_name(answer)
        task = Task(f"task-{next(self.ids)}")
        self.tasks[task.id] = task
        task.runner = asyncio.create_task(self._run(task, name, args))
        return {"resultType": "task", **task.wire()}

    async def _run(self, task: Task, name: str, args: dict[str, Any]) -> None:
        try:
            task.ended("completed", await self._work(task, name, args))
        except MCPError as error:
            task.ended("failed", error=error.error.model_dump(by_alias=True, exclude_none=True))
        except asyncio.CancelledError:
            task.ended("cancelled")

    async def _work(self, task: Task, name: str, args: dict[str, Any]) -> dict[str, Any]:
        if name == "slow_compute":
            await asyncio.sleep(float(args.get("seconds", 1)))
            return _wire(f"computed {args.get('label', '')}".strip())
        if name == "failing_job":
            await asyncio.sleep(1)
            return {**_wire("the job failed"), "isError": True}
        if name == "protocol_error_job":
            raise MCPError(types.INTERNAL_ERROR, "the job crashed")
        if name == "test_tool_with_task":
            return _wire(f"Hello, {args['user_name']}! The task ran.")
        if name == "slow_increment":
            await asyncio.sleep(float(args.get("seconds", 1)))
            return self._incremented(str(args.get("name")))
        if name == "stubborn_increment":
            await _unstoppable(float(args.get("seconds", 1)))
            return self._incremented(str(args.get("name")))
        asked = {"confirm": _confirm("Delete it?")}
        if name == "ask_then_increment":
            asked = {"confirm": _confirm(f"Add one to {args.get('name')}?")}
        if name == "multi_input":
            asked = {"first": _confirm("First question?"), "second": _confirm("Second question?")}
        task.asking, task.status, task.updated = dict(asked), "input_required", _now()
        while task.asking:
            await task.answered.wait()
            task.answered.clear()
        task.status, task.updated = "working", _now()
        if name == "ask_then_increment":
            return self._incremented(str(args.get("name")))
        return _wire("deleted" if name == "confirm_delete" else "both answered")

    def _incremented(self, counter: str) -> dict[str, Any]:
        self.counters[counter] = self.counters.get(counter, 0) + 1
        return {
            **_wire(f"{counter} is {self.counters[counter]}"),
            "structuredContent": {"value": self.counters[counter]},
        }

    def _counted(self, tool: str, counter: str) -> types.CallToolResult:
        if tool == "decrement":
            self.counters[counter] = self.counters.get(counter, 0) - 1
            self.decrements[counter] = self.decrements.get(counter, 0) + 1
        value, undone = self.counters.get(counter, 0), self.decrements.get(counter, 0)
        said = types.CallToolResult(content=[types.TextContent(type="text", text=f"{counter} is {value}")])
        said.structured_content = {"value": value, "decrements": undone}
        return said

    def _task(self, ctx: Ctx, params: TaskParams) -> Task:
        if not _declared(ctx):
            data: dict[str, Any] = {"requiredCapabilities": {"extensions": {TASKS: {}}}}
            raise MCPError(types.MISSING_REQUIRED_CLIENT_CAPABILITY, "declare the tasks extension first", data)
        headers = getattr(ctx.request, "headers", None)
        named = headers.get("mcp-name") if headers is not None else None
        if named is not None and named != params.task_id:
            raise MCPError(HEADER_MISMATCH, f"Mcp-Name {named!r} is not params.taskId {params.task_id!r}")
        task = self.tasks.get(params.task_id)
        if task is None:
            raise MCPError(types.INVALID_PARAMS, f"no task {params.task_id}")
        return task

    async def get(self, ctx: Ctx, params: TaskParams) -> dict[str, Any]:
        task = self._task(ctx, params)
        detailed: dict[str, Any] = {"resultType": "complete", **task.wire()}
        if task.status == "completed":
            detailed["result"] = task.result
        if task.status == "failed":
            detailed["error"] = task.error
        if task.status == "input_required":
            detailed["inputRequests"] = task.asking
        return detailed

    async def update(self, ctx: Ctx, params: TaskParams) -> dict[str, Any]:
        task = self._task(ctx, params)
        for key in params.input_responses or {}:
            task.asking.pop(key, None)
        task.updated = _now()
        task.answered.set()
        return {"resultType": "complete"}

    async def cancel(self, ctx: Ctx, params: TaskParams) -> dict[str, Any]:
        task = self._task(ctx, params)
        self.cancelling += 1
        self.most_cancelling = max(self.most_cancelling, self.cancelling)
        try:
            if task.runner is not None and not task.runner.done():
                task.runner.cancel()
                await asyncio.wait([task.runner])
        finally:
            self.cancelling -= 1
        return {"resultType": "complete"}


async def _unstoppable(seconds: float) -> None:
    """Sleeps `seconds`, whatever cancels it meanwhile: a server whose tasks/cancel waits for the
    task to end on its own."""
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while (left := end - loop.time()) > 0:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(left)


def _declared(ctx: Ctx) -> bool:
    capabilities = ctx.session.client_capabilities
    return capabilities is not None and TASKS in (capabilities.extensions or {})


def _text(said: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=said)])


def _wire(said: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": said}], "isError": False}


def _named() -> dict[str, Any]:
    schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    return {
        "method": "elicitation/create",
        "params": {"mode": "form", "message": "Your name?", "requestedSchema": schema},
    }


def _answered_name(answer: Any) -> str:
    content = answer.get("content") if isinstance(answer, dict) else getattr(answer, "content", None)
    return str((content or {}).get("name", "someone"))
