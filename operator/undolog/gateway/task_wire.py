"""The tasks extension's shapes on the wire (`io.modelcontextprotocol/tasks`, SEP-2663), as the
gateway's clients of its upstreams send and read them: a tool call answered with a task, and
the task's own requests (tasks/get, tasks/update, tasks/cancel) with their answers kept whole."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import mcp_types as types
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.shared.exceptions import MCPError
from pydantic import ConfigDict

from undolog.gateway.agent_requests import TASKS


class TaskCreated(types.Result):
    """An upstream's answer to a tool call that started a task: the task's fields, as they came."""

    model_config = ConfigDict(extra="allow")
    result_type: Literal["task"] = "task"
    task_id: str


class TaskParams(types.RequestParams):
    model_config = ConfigDict(extra="allow")  # tasks/update's inputResponses, and what comes later
    task_id: str


class TaskRequest(types.Request[TaskParams, str]):
    name_param: ClassVar[str | None] = "taskId"  # SEP-2663: Mcp-Name carries the task id


class Passed(types.Result):
    """A server's answer kept whole, whatever fields it has."""

    model_config = ConfigDict(extra="allow")
    result_type: str | None = None


async def _not_resolved(created: TaskCreated, context: ClaimContext) -> types.CallToolResult:
    raise MCPError(types.INTERNAL_ERROR, "the gateway hands a task to its agent; it does not wait for it")


class TasksClient(ClientExtension):
    """What the gateway's client of an upstream declares for an agent that declared the extension."""

    identifier = TASKS

    def claims(self) -> list[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=TaskCreated, resolve=_not_resolved)]
