"""The conformance upstream's tools and prompt of the stateless revision (2026-07-28), to the
server specification of @modelcontextprotocol/conformance 0.2.0-alpha.12 (its scenarios
`input-required-result-*` and `server-stateless`): a server's questions to the user as
`input_required` results answered by the client's retry, and the diagnostic tools that need a
capability the client declares per request."""

from __future__ import annotations

import json
from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError

Ctx = ServerRequestContext[Any]
Answers = dict[str, Any]


def _form(message: str, **fields: str) -> types.ElicitRequest:
    schema = {"type": "object", "properties": {k: {"type": t} for k, t in fields.items()}, "required": list(fields)}
    return types.ElicitRequest(params=types.ElicitRequestFormParams(message=message, requested_schema=schema))


def _sample(prompt: str, tokens: int) -> types.CreateMessageRequest:
    message = types.SamplingMessage(role="user", content=types.TextContent(type="text", text=prompt))
    return types.CreateMessageRequest(params=types.CreateMessageRequestParams(messages=[message], max_tokens=tokens))


ROOTS = types.ListRootsRequest()
ASKED: dict[str, types.InputRequests] = {
    "test_input_required_result_elicitation": {"user_name": _form("What is your name?", name="string")},
    "test_input_required_result_sampling": {"capital_question": _sample("What is the capital of France?", 100)},
    "test_input_required_result_list_roots": {"client_roots": ROOTS},
    "test_input_required_result_request_state": {"confirm": _form("Please confirm", ok="boolean")},
    "test_input_required_result_tampered_state": {"confirm": _form("Please confirm", ok="boolean")},
    "test_input_required_result_multiple_inputs": {
        "user_name": _form("What is your name?", name="string"),
        "greeting": _sample("Generate a greeting", 50),
        "client_roots": ROOTS,
    },
}
WITH_STATE = {  # the tools whose first round carries requestState, and the state it carries
    "test_input_required_result_request_state": "round-1",
    "test_input_required_result_tampered_state": "round-1",
    "test_input_required_result_multiple_inputs": "round-1",
}
TOOLS = [
    types.Tool(name=name, description=description, input_schema={"type": "object", "properties": {}})
    for name, description in (
        *((name, f"Asks the client for {', '.join(asked)} first (input_required)") for name, asked in ASKED.items()),
        ("test_input_required_result_multi_round", "Asks for a name, then a colour, each in its own round"),
        ("test_input_required_result_capabilities", "Asks only what the client declared it can answer"),
        ("test_missing_capability", "Needs the client's sampling capability (-32021 without it)"),
        ("test_streaming_elicitation", "Asks the user through an input_required result on the response stream"),
        ("test_logging_tool", "Logs while it runs, when the request asked for logs"),
    )
]
PROMPT = types.Prompt(name="test_input_required_result_prompt", description="Asks the user for context first")


def _text(said: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=said)])


def _answered(params: types.CallToolRequestParams | types.GetPromptRequestParams) -> Answers:
    return {
        k: v.model_dump(by_alias=True, exclude_none=True, mode="json")
        for k, v in (params.input_responses or {}).items()
    }


def _missing(capability: str) -> MCPError:
    data: dict[str, Any] = {"requiredCapabilities": {capability: {}}}
    return MCPError(types.MISSING_REQUIRED_CLIENT_CAPABILITY, f"this tool needs the client's {capability}", data)


async def call(ctx: Ctx, params: types.CallToolRequestParams) -> types.CallToolResult | types.InputRequiredResult:
    """The tool `params` names, a round of it."""
    name, answers, state = params.name, _answered(params), params.request_state
    declared = ctx.session.client_capabilities or types.ClientCapabilities()
    if name in ASKED:
        asked = ASKED[name]
        if not set(asked) <= set(answers) or state != WITH_STATE.get(name, state):
            return types.InputRequiredResult(input_requests=asked, request_state=WITH_STATE.get(name))
        return _text(f"{'state-ok: ' if name in WITH_STATE else ''}{_said(answers)}")
    if name == "test_input_required_result_multi_round":
        if state == "round-2" and "step2" in answers:
            return _text(f"Done: {_said(answers)}")
        if "step1" in answers:
            return types.InputRequiredResult(
                input_requests={"step2": _form("Step 2: What is your favorite color?", color="string")},
                request_state="round-2",
            )
        return types.InputRequiredResult(
            input_requests={"step1": _form("Step 1: What is your name?", name="string")}, request_state="round-1"
        )
    if name == "test_input_required_result_capabilities":
        offered = {
            "user_name": (declared.elicitation, _form("What is your name?", name="string")),
            "greeting": (declared.sampling, _sample("Generate a greeting", 50)),
            "client_roots": (declared.roots, ROOTS),
        }
        wanted = {k: request for k, (capable, request) in offered.items() if capable is not None and k not in answers}
        return types.InputRequiredResult(input_requests=wanted) if wanted else _text(f"Done: {_said(answers)}")
    return await _diagnostic(ctx, name, declared)


async def _diagnostic(
    ctx: Ctx, name: str, declared: types.ClientCapabilities
) -> types.CallToolResult | types.InputRequiredResult:
    if name == "test_missing_capability":
        if declared.sampling is None:
            raise _missing("sampling")
        return _text("the client can sample")
    if name == "test_streaming_elicitation":
        if declared.elicitation is None:
            raise _missing("elicitation")
        return types.InputRequiredResult(input_requests={"confirm": _form("Continue?", ok="boolean")})
    if name == "test_logging_tool":
        for said in ("started", "working", "done"):
            await ctx.session.send_log_message("info", said, related_request_id=ctx.request_id)
        return _text("logged when asked to")
    raise MCPError(types.INVALID_PARAMS, f"unknown tool {name}")


async def prompt(params: types.GetPromptRequestParams) -> types.GetPromptResult | types.InputRequiredResult:
    answers = _answered(params)
    if "user_context" not in answers:
        asked = _form("What context should the prompt use?", context="string")
        return types.InputRequiredResult(input_requests={"user_context": asked})
    said = f"Use this context: {_said(answers)}"
    message = types.PromptMessage(role="user", content=types.TextContent(type="text", text=said))
    return types.GetPromptResult(messages=[message])


def _said(answers: Answers) -> str:
    return json.dumps(answers, sort_keys=True)[:500]
