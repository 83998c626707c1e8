"""The agent's own tools (undolog_commit, undolog_abort, undolog_rewind, undolog_status), on
the saga its request is bound to, in either era."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import mcp_types as types
from prometheus_client import Counter

from undolog.api.gateway import OnClose
from undolog.gateway.bindings import SagaBinding
from undolog.gateway.steps import plan_text
from undolog.kube import Kube
from undolog.sdk import SagaRun

NONE_OPEN = "no saga is open in this session"
sessions_ended = Counter(
    "undolog_gateway_sessions", "Agents' sagas ended through the gateway (either era), by how", ["outcome"]
)


def _schema(**properties: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {name: {"type": "string", "description": said} for name, said in properties.items()},
        "required": list(properties),
    }


OWN_TOOLS = [
    types.Tool(
        name="undolog_commit", description="Commit this session's saga: its steps stay done.", input_schema=_schema()
    ),
    types.Tool(
        name="undolog_abort",
        description="Abort this session's saga: UndoLog undoes its steps, newest first.",
        input_schema=_schema(reason="Why (shown to whoever triages it)."),
    ),
    types.Tool(
        name="undolog_rewind",
        description="Undo the steps after one step (newest first) and carry on from there.",
        input_schema=_schema(to_step="The step to keep (its name, or its position).", reason="Why."),
    ),
    types.Tool(
        name="undolog_status",
        description="This session's saga and what an abort would undo, in order.",
        input_schema=_schema(),
        annotations=types.ToolAnnotations(read_only_hint=True),
    ),
]
OWN_NAMES = frozenset(tool.name for tool in OWN_TOOLS)


class OwnTools:
    def __init__(self, kube: Kube, settle: Callable[[SagaRun], Awaitable[None]]) -> None:
        self.kube = kube
        self.settle = settle  # before an abort: the saga's running tasks cancelled (tasks.py)

    async def call(self, tool: str, binding: SagaBinding, arguments: dict[str, Any], who: str | None) -> str:
        """`who`: the caller, named in the abort's reason (who undid it)."""
        if tool == "undolog_commit":
            return await self.end(tool, binding, OnClose.COMMIT, "committed by the agent")
        if tool == "undolog_abort":
            reason = str(arguments.get("reason") or "aborted by the agent")
            return await self.end(tool, binding, OnClose.ABORT, f"{reason} (aborted by {who})" if who else reason)
        if tool == "undolog_rewind":
            return await self.rewind(tool, binding, str(arguments.get("to_step", "")), arguments.get("reason"))
        run = await binding.named(tool)
        if run is None:
            return f"{NONE_OPEN}: no step has run that could be undone"
        return f"saga {run.namespace}/{run.name}; undone on abort, newest first: {await plan_text(self.kube, run)}"

    async def end(self, tool: str, binding: SagaBinding, outcome: OnClose, reason: str) -> str:
        """Commit or abort the request's saga (counted); what was done, said for the agent."""
        run = await binding.named(tool)
        if run is None:
            return f"{NONE_OPEN}: nothing to commit or abort"
        binding.ended(run)
        saga = f"saga {run.namespace}/{run.name}"
        if outcome == OnClose.COMMIT:
            await run.commit()
            sessions_ended.labels("committed").inc()
            return f"{saga} committed: its steps stay done"
        await self.settle(run)
        plan = await plan_text(self.kube, run)
        await run.abort(reason)
        sessions_ended.labels("aborted").inc()
        return f"{saga} aborted ({reason}); the operator undoes, newest first: {plan}"

    async def rewind(self, tool: str, binding: SagaBinding, to_step: str, reason: object) -> str:
        run = await binding.named(tool) or await binding.opened()
        await run.rewind_to(int(to_step) if to_step.isdigit() else to_step, str(reason or "rewind"))
        saga = f"saga {run.namespace}/{run.name}"
        return f"{saga} rewound to {to_step}: the steps after it are undone; {binding.carry_on}"
