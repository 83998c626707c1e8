"""`undolog mcp`: an MCP server in front of the upstream MCP servers, built on the `mcp`
package's low-level server. It lists the upstreams' tools and the agent's own four
(undolog_commit, undolog_abort, undolog_rewind, undolog_status) and decides per call
(decisions.tool_calls) whether it passes through, is registered as a step first, or is refused.

A session is the streamable HTTP session (its Mcp-Session-Id), or the one stdio connection.
Requests of the stateless protocol (2026-07-28) have none: their steps are tied to a saga by
the handle the agent passes back (gateway/handles.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import NotificationOptions, Server
from mcp.server.request_state import authenticated_principal
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from prometheus_client import Counter

from undolog.api.gateway import GatewayConfig, OnClose
from undolog.decisions import saga_handles
from undolog.decisions.saga_handles import HandleRefusal
from undolog.decisions.tool_calls import PassThrough, Refuse, Register, ToolDecision, decide
from undolog.errors import UndoLogError
from undolog.gateway import agent_requests, confirmations
from undolog.gateway.changes import Changes
from undolog.gateway.handles import HANDLE_ARG, HANDLE_META, HandleSagas, advertised
from undolog.gateway.relay import Relay
from undolog.gateway.sessions import SAGA_META, NotCalled, SessionSaga
from undolog.gateway.upstreams import Rounds, Upstreams, UpstreamTool
from undolog.kube import Kube

tool_calls = Counter(
    "undolog_gateway_tool_calls",
    "Agents' tool calls through the gateway, by what it did with them",
    ["tool", "outcome"],
)
sessions_ended = Counter("undolog_gateway_sessions", "Sessions whose saga ended, by how", ["outcome"])


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


class ListChangingServer(Server[Any]):
    """The low-level server, saying on sessions too that its lists change (changes.py tells
    them; on the stateless revision it says so by serving subscriptions/listen)."""

    def get_capabilities(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
        *,
        protocol_version: str | None = None,
    ) -> types.ServerCapabilities:
        changing = NotificationOptions(prompts_changed=True, resources_changed=True, tools_changed=True)
        return super().get_capabilities(
            changing, experimental_capabilities, extensions, protocol_version=protocol_version
        )


def stepped(
    result: types.CallToolResult | types.InputRequiredResult,
) -> tuple[types.CallToolResult | types.InputRequiredResult, str]:
    """A step's result and its outcome to count: `asked` when its server asked the user first."""
    if isinstance(result, types.InputRequiredResult):
        return result, "asked"
    return result, "failed" if result.is_error else "registered"


def stateless(ctx: ServerRequestContext[Any]) -> bool:
    """A request of the stateless revision (2026-07-28): no session, a saga handle instead."""
    return ctx.protocol_version in MODERN_PROTOCOL_VERSIONS


def said(text: str, *, error: bool = False) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=error)


class Gateway:
    def __init__(self, config: GatewayConfig, kube: Kube, upstreams: Upstreams, handle_key: bytes) -> None:
        self.config, self.kube, self.upstreams = config, kube, upstreams
        self.sessions: dict[str, SessionSaga] = {}
        self.handles = HandleSagas(config, kube, upstreams, handle_key)
        self.relay = Relay(upstreams)  # resources, prompts, completion, logging: passed through
        self.changes = Changes(upstreams)
        raw: dict[str, Any] = {
            "on_list_tools": self.list_tools,
            "on_call_tool": self.call_tool,
            **self.relay.handlers(),
        }
        # Each handler with its request as the current one: what an upstream sends during it comes back to it.
        handlers: dict[str, Any] = {name: agent_requests.serving(h, self._seen) for name, h in raw.items()}
        self.server: Server[Any] = ListChangingServer(
            "undolog-gateway", on_subscriptions_listen=self.changes.listen, **handlers
        )
        self._own: dict[str, Callable[[SessionSaga, dict[str, Any]], Awaitable[str]]] = {
            "undolog_commit": lambda s, _: self._end(s, OnClose.COMMIT, "committed by the agent"),
            "undolog_abort": lambda s, a: self._end(s, OnClose.ABORT, str(a.get("reason") or "aborted by the agent")),
            "undolog_rewind": lambda s, a: s.rewind(str(a.get("to_step", "")), str(a.get("reason") or "rewind")),
            "undolog_status": lambda s, _: s.status(),
        }

    async def list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        listed = [
            types.Tool.model_validate({**found.tool.model_dump(by_alias=True, exclude_none=True), "name": name})
            for name, found in self.upstreams.tools.items()
        ]
        if not stateless(ctx):
            return types.ListToolsResult(tools=[*listed, *OWN_TOOLS])
        steps = [self._registered(found) for found in self.upstreams.tools.values()]
        tools = [advertised(tool) if step else tool for tool, step in zip(listed, steps, strict=True)]
        return types.ListToolsResult(tools=[*tools, *(advertised(own) for own in OWN_TOOLS)])

    def _decided(self, found: UpstreamTool) -> ToolDecision:
        return decide(self.config, found.qualified, found.read_only_hint, found.destructive_hint)

    def _registered(self, found: UpstreamTool) -> bool:
        return isinstance(self._decided(found), Register)

    async def call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        name, arguments = params.name, dict(params.arguments or {})
        identity = authenticated_principal(ctx) if stateless(ctx) else None
        own = self._own.get(name)
        if own is not None:
            try:
                if stateless(ctx):
                    return said(await self.handles.own(name, arguments, identity))
                return said(await own(self._session(ctx, name), arguments))
            except (UndoLogError, ValueError, TimeoutError) as error:
                return said(f"{name}: {error}", error=True)
        found = self.upstreams.tools.get(name)
        if found is None:
            raise MCPError(types.INVALID_PARAMS, f"unknown tool {name!r}")
        decision = self._decided(found)
        if isinstance(decision, PassThrough):
            tool_calls.labels(found.qualified, "passed").inc()
            arguments.pop(HANDLE_ARG, None)
            if stateless(ctx):  # a server's question and the agent's answers pass as they are
                return await self.upstreams.call(found, arguments, None, Rounds.of(params))
            return await self.upstreams.call(found, arguments, None)
        if isinstance(decision, Refuse):
            tool_calls.labels(found.qualified, "refused").inc()
            raise MCPError(types.INVALID_PARAMS, decision.message)
        try:
            result, outcome = await self._step(ctx, params, found, arguments, decision, identity)
        except NotCalled as refused:
            tool_calls.labels(found.qualified, "refused").inc()
            raise MCPError(types.INVALID_PARAMS, str(refused)) from None
        tool_calls.labels(found.qualified, outcome).inc()
        return result

    async def _step(
        self,
        ctx: ServerRequestContext[Any],
        params: types.CallToolRequestParams,
        found: UpstreamTool,
        arguments: dict[str, Any],
        decision: Register,
        identity: str | None,
    ) -> tuple[types.CallToolResult | types.InputRequiredResult, str]:
        """The call as a step of the session's saga, or of the handle's (stateless); there, the
        retry of one whose server asked for input first carries on the step its requestState
        names (the user's allowance with it). With the outcome to count: `refused` while the
        user is asked, or has not allowed it."""
        if not stateless(ctx):
            declined = await self._confirmed(ctx, params, found, arguments, None) if decision.confirm else None
            if declined is not None:
                return declined, "refused"
            return stepped(await self._session(ctx, found.qualified).call(found, arguments, decision.rule))
        carried = saga_handles.opened_round(self.handles.key, params.request_state)
        if isinstance(carried, HandleRefusal):
            raise NotCalled(f"tool {found.qualified} was not called: {carried.message}")
        answers = {k: v for k, v in (params.input_responses or {}).items() if k != confirmations.CONFIRM_INPUT}
        rounds = Rounds(answers or None, carried.state if carried is not None else params.request_state)
        confirmed = carried is not None and carried.confirmed
        if decision.confirm and not confirmed:
            asking = await self._confirmed(ctx, params, found, arguments, identity)
            if asking is not None:
                return asking, "refused"
            confirmed = True
        return stepped(await self.handles.call(found, arguments, decision.rule, identity, rounds, carried, confirmed))

    async def _confirmed(
        self,
        ctx: ServerRequestContext[Any],
        params: types.CallToolRequestParams,
        found: UpstreamTool,
        arguments: dict[str, Any],
        identity: str | None,
    ) -> types.CallToolResult | types.InputRequiredResult | None:
        """The user asked before a call that cannot be undone: None when they allowed it (the
        call goes on); else what to answer the agent (the question, or that it was declined).
        Either answer is recorded on the saga."""
        if stateless(ctx):
            answer = confirmations.answered(params)
            if answer is None:
                return confirmations.asked(found, arguments)
            try:
                run = await self.handles.run_for(arguments, identity)
            except UndoLogError as refused:
                raise NotCalled(f"tool {found.qualified} was not called: {refused}") from refused
            meta = {HANDLE_META: arguments[HANDLE_ARG]}
        else:
            answer = await confirmations.ask_in_session(ctx, found, arguments)
            run = await self._session(ctx, found.qualified).saga()
            meta = {}
        await confirmations.record(self.kube, run, found, answer, identity)
        if answer == "accept":
            return None
        return confirmations.declined(found, answer, {**meta, SAGA_META: f"{run.namespace}/{run.name}"})

    def _session(self, ctx: ServerRequestContext[Any], tool: str) -> SessionSaga:
        key = agent_requests.session_key(ctx)
        if key is None:
            raise MCPError(
                types.INVALID_REQUEST,
                f"tool {tool} needs a session to be undoable: connect with the initialize handshake (protocol "
                "2025-11-25 or earlier), whose Mcp-Session-Id ties this call's step to the session's saga",
            )
        session = self.sessions.get(key)
        if session is None:
            session = self.sessions[key] = SessionSaga(self.config, self.kube, self.upstreams)
        session.last_seen = time.monotonic()
        return session

    async def _end(self, session: SessionSaga, outcome: OnClose, reason: str) -> str:
        opened = session.run is not None
        text = await session.end(outcome, reason)
        if opened:
            sessions_ended.labels("committed" if outcome == OnClose.COMMIT else "aborted").inc()
        return text

    def _seen(self, request: agent_requests.AgentRequest) -> None:
        self.changes.seen(request.session_key, request.session)

    async def close_session(self, key: str, why: str) -> None:
        """The session ended (DELETE, idle, the gateway stopping): its open saga as onClose says."""
        self.upstreams.close_session(key)
        self.changes.forget(key)
        session = self.sessions.pop(key, None)
        if session is not None and session.run is not None:
            await self._end(session, self.config.on_close, f"the agent's session ended without a commit ({why})")

    async def reap_idle(self) -> None:
        """End sessions idle past idleSeconds (the SDK forgets them; their sagas must not wait)."""
        while True:
            await asyncio.sleep(min(self.config.idle_seconds / 4, 30.0))
            cutoff = time.monotonic() - self.config.idle_seconds
            for key in [k for k, s in self.sessions.items() if s.last_seen < cutoff]:
                await self.close_session(key, f"idle for {self.config.idle_seconds:g} s")

    async def close_all(self, why: str) -> None:
        for key in list(self.sessions):
            await self.close_session(key, why)
