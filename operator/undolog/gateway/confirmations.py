"""A person asked before what cannot be undone (`confirm: true`, or `unmapped: confirm`): the
gateway asks the user through the protocol (elicitation on a session; an `input_required`
result on the stateless revision, answered when the client calls again) that the call will not
be undone. Declined or dismissed: not called. Either way the answer (which, when, by which
client identity) is recorded on the saga, an annotation `undolog.io/confirmation-<id>`."""

from __future__ import annotations

import json
import uuid
from typing import Any

import mcp_types as types

from undolog.conventions import timestamp
from undolog.decisions.tool_calls import Register
from undolog.gateway.agent_requests import AgentRequest
from undolog.gateway.catalogue import UpstreamTool
from undolog.kube import Kube
from undolog.ledger import Ledger
from undolog.sdk import SagaRun

CONFIRM_INPUT = "undolog_confirm"  # the input request's key on the stateless revision
ANNOTATION_PREFIX = "undolog.io/confirmation-"
EMPTY_FORM: dict[str, Any] = {"type": "object", "properties": {}}


def question(tool: UpstreamTool, arguments: dict[str, Any], decision: Register) -> str:
    shown = json.dumps(arguments, sort_keys=True)
    shown = shown if len(shown) <= 300 else shown[:297] + "..."
    asked = f"The agent wants to call {tool.qualified} with {shown}."
    if decision.rule is not None and decision.rule.compensation is not None:
        return (
            f"{asked} Policy {decision.asked_by} asks you first (UndoLog undoes it if the work is aborted). Allow it?"
        )
    if decision.asked_by is not None:
        asked += f" Policy {decision.asked_by} asks you first."
    return f"{asked} UndoLog cannot undo this call: if the work is aborted later, its effect stays. Allow it?"


def asked(tool: UpstreamTool, arguments: dict[str, Any], decision: Register) -> types.InputRequiredResult:
    """The stateless revision's way to ask: the client asks its user, then calls again."""
    request = types.ElicitRequest(
        params=types.ElicitRequestFormParams(message=question(tool, arguments, decision), requested_schema=EMPTY_FORM)
    )
    return types.InputRequiredResult(input_requests={CONFIRM_INPUT: request})


def answered(params: types.CallToolRequestParams) -> str | None:
    """The user's answer a stateless client brought back (accept, decline, cancel); None: not asked yet."""
    response = (params.input_responses or {}).get(CONFIRM_INPUT)
    action = getattr(response, "action", None)
    if action is None and isinstance(response, dict):
        action = response.get("action")
    return str(action) if action is not None else None


async def ask_in_session(
    request: AgentRequest, tool: UpstreamTool, arguments: dict[str, Any], decision: Register
) -> str:
    """The session's way to ask (elicitation); `cancel` when the client cannot ask its user."""
    try:
        asking = question(tool, arguments, decision)
        result = await request.session.elicit_form(asking, EMPTY_FORM, request.request_id)
    except Exception:  # no elicitation capability or back-channel: nobody was asked, so not allowed
        return "cancel"
    return str(result.action)


async def record(kube: Kube, run: SagaRun, tool: UpstreamTool, answer: str, identity: str | None) -> None:
    said = {"tool": tool.qualified, "answer": answer, "at": timestamp(), "client": identity or "unauthenticated"}
    key = f"{ANNOTATION_PREFIX}{uuid.uuid4().hex[:12]}"
    await Ledger(kube).annotate("sagas", run.namespace, run.name, {key: json.dumps(said, sort_keys=True)})


def declined(tool: UpstreamTool, answer: str, meta: dict[str, Any]) -> types.CallToolResult:
    text = f"{tool.qualified} was not called: the user {'declined' if answer == 'decline' else 'did not allow'} it"
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True, meta=meta)
