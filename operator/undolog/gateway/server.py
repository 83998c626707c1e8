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
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import NotificationOptions, Server
from mcp.shared.exceptions import MCPError
from prometheus_client import Counter

from undolog.api.gateway import GatewayConfig
from undolog.decisions.policies import Policies, with_policy
from undolog.decisions.tenancy import TenantRefused, Tenants
from undolog.decisions.tool_calls import PassThrough, Refuse, Register, ToolDecision, decide
from undolog.errors import UndoLogError
from undolog.gateway import agent_requests, confirmations, handles
from undolog.gateway.agent_requests import AgentRequest
from undolog.gateway.bindings import SagaBinding
from undolog.gateway.caller_limits import LimitReached, Limits
from undolog.gateway.catalogue import ToolCatalogue, UpstreamTool
from undolog.gateway.changes import Changes
from undolog.gateway.handles import HANDLE_ARG, HandleSagas, advertised
from undolog.gateway.object_steps import ObjectSteps
from undolog.gateway.operator_webhooks import OperatorWebhooks
from undolog.gateway.own_tools import OWN_NAMES, OWN_TOOLS, OwnTools
from undolog.gateway.relay import Relay
from undolog.gateway.sessions import SessionBinding, SessionSagas
from undolog.gateway.steps import SAGA_META, NotCalled, Steps, ToolCall
from undolog.gateway.subscriptions import Subscriptions
from undolog.gateway.task_wire import TaskCreated
from undolog.gateway.tasks import Tasks, handed
from undolog.gateway.upstreams import Answer, Rounds, Upstreams
from undolog.kube import Kube

P = TypeVar("P")
R = TypeVar("R")
tool_calls = Counter(
    "undolog_gateway_tool_calls",
    "Agents' tool calls through the gateway, by what it did with them",
    ["tool", "outcome"],
)


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


def stepped(result: Answer) -> tuple[Answer, str]:
    """A step's result and its outcome to count: `asked` when its server asked the user first,
    `task` when it runs as a task."""
    if isinstance(result, types.InputRequiredResult):
        return result, "asked"
    if isinstance(result, TaskCreated):
        return result, "task"
    return result, "failed" if result.is_error else "registered"


def said(text: str, *, error: bool = False) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=error)


class Gateway:
    def __init__(
        self,
        config: GatewayConfig,
        kube: Kube,
        upstreams: Upstreams,
        catalogue: ToolCatalogue,
        subscriptions: Subscriptions,
        handle_key: bytes,
        webhooks: OperatorWebhooks,
    ) -> None:
        self.config, self.kube, self.upstreams, self.catalogue = config, kube, upstreams, catalogue
        self.tenants, self.policies = Tenants(config), Policies(config)
        self.limits, self.webhooks = Limits(config.limits, kube), webhooks
        self.sessions = SessionSagas(config, kube, self._opening)
        self.handles = HandleSagas(config, kube, handle_key, self._opening)
        self.steps = Steps(upstreams, catalogue, ObjectSteps(kube), handle_key)
        self.tasks = Tasks(upstreams, kube, handle_key, self.steps.task_ended)
        self.own = OwnTools(kube, self.tasks.settle_open)
        self.relay = Relay(upstreams, subscriptions)  # resources, prompts, completion, logging: passed through
        self.changes = Changes(upstreams, subscriptions, catalogue)
        raw: dict[str, Any] = {
            "on_list_tools": self.list_tools,
            "on_call_tool": self.call_tool,
            **self.relay.handlers(),
        }
        handlers: dict[str, Any] = {name: self._served(handler) for name, handler in raw.items()}
        self.server: Server[Any] = ListChangingServer(
            "undolog-gateway", on_subscriptions_listen=self.changes.listen, **handlers
        )
        self.tasks.install(self.server)

    async def _opening(self, who: str | None, namespace: str) -> None:
        """Before a caller's saga opens: within its limits, and its undo callable in its namespace."""
        await self.limits.opening(who, namespace)
        await self.webhooks.serve_in(namespace)

    def _served(
        self, handler: Callable[[AgentRequest, P], Awaitable[R]]
    ) -> Callable[[ServerRequestContext[Any], P], Awaitable[R]]:
        """The SDK's handler: the request it serves made once, and given to `handler`."""

        async def handled(ctx: ServerRequestContext[Any], params: P) -> R:
            request = agent_requests.of(ctx)
            self.changes.seen(request.session_key, request.session)
            return await handler(request, params)

        return handled

    async def list_tools(
        self, request: AgentRequest, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        shown = {
            name: found
            for name, found in self.catalogue.of(request.stateless).items()
            if self.policies.shown(request.principal, found.qualified)
        }
        listed = [
            types.Tool.model_validate({**found.tool.model_dump(by_alias=True, exclude_none=True), "name": name})
            for name, found in shown.items()
        ]
        if not request.stateless:
            return types.ListToolsResult(tools=[*listed, *OWN_TOOLS])
        steps = [isinstance(self._decided(found), Register) for found in shown.values()]
        tools = [advertised(tool) if step else tool for tool, step in zip(listed, steps, strict=True)]
        return types.ListToolsResult(tools=[*tools, *(advertised(own) for own in OWN_TOOLS)])

    def _decided(self, found: UpstreamTool) -> ToolDecision:
        return decide(self.config, found.qualified, found.read_only_hint, found.destructive_hint)

    def _binding(
        self, request: AgentRequest, tool: str, params: types.CallToolRequestParams, arguments: dict[str, Any]
    ) -> SagaBinding:
        """The saga this request belongs to, in its caller's namespace: its session's, or its
        handle's (taken out of `arguments`); NotCalled when the caller has no namespace here."""
        try:
            namespace = self.tenants.namespace_of(request.principal)
        except TenantRefused as refused:
            raise NotCalled(f"tool {tool} was not called: {refused}") from None
        if not request.stateless:
            return SessionBinding(self.sessions.of(request, tool, namespace))
        caller = (request.identity, namespace)
        return handles.binding(self.handles, caller, tool, arguments, params.request_state, params.input_responses)

    async def call_tool(self, request: AgentRequest, params: types.CallToolRequestParams) -> Answer:
        name, arguments = params.name, dict(params.arguments or {})
        try:
            self.limits.called(request.identity)
        except LimitReached as reached:
            raise MCPError(types.INVALID_REQUEST, f"tool {name} was not called: {reached}") from None
        if name in OWN_NAMES:
            return await self._own(request, name, params, arguments)
        found = self.catalogue.of(request.stateless).get(name)
        if found is None:
            raise MCPError(types.INVALID_PARAMS, f"unknown tool {name!r}")
        given = {k: v for k, v in arguments.items() if not (request.stateless and k == HANDLE_ARG)}
        ruled = self.policies.ruled(request.principal, found.qualified, given)
        decision = with_policy(self._decided(found), ruled, found.qualified)
        if isinstance(decision, PassThrough):
            tool_calls.labels(found.qualified, "passed").inc()
            arguments.pop(HANDLE_ARG, None)
            if request.stateless:  # a server's question and the agent's answers pass as they are
                result = await self.upstreams.call(request, found, arguments, None, Rounds.of(params))
                return (
                    handed(self.tasks.key, request, found.upstream, result)
                    if isinstance(result, TaskCreated)
                    else result
                )
            return await self.upstreams.call(request, found, arguments, None)
        if isinstance(decision, Refuse):
            tool_calls.labels(found.qualified, "refused").inc()
            raise MCPError(types.INVALID_PARAMS, decision.message)
        try:
            result, outcome = await self._step(request, params, found, arguments, decision)
        except NotCalled as refused:
            tool_calls.labels(found.qualified, "refused").inc()
            raise MCPError(types.INVALID_PARAMS, str(refused)) from None
        tool_calls.labels(found.qualified, outcome).inc()
        return result

    async def _own(
        self, request: AgentRequest, name: str, params: types.CallToolRequestParams, arguments: dict[str, Any]
    ) -> types.CallToolResult:
        try:
            binding = self._binding(request, name, params, arguments)
            told = await self.own.call(name, binding, arguments, request.identity)
        except (UndoLogError, ValueError, TimeoutError) as error:
            return said(f"{name}: {error}", error=True)
        return said(told)

    async def _step(
        self,
        request: AgentRequest,
        params: types.CallToolRequestParams,
        found: UpstreamTool,
        arguments: dict[str, Any],
        decision: Register,
    ) -> tuple[Answer, str]:
        """The call as a step of its saga; a stateless retry of one whose server asked for input
        first carries on the step its requestState names (the user's allowance with it). With
        the outcome to count: `refused` while the user is asked, or has not allowed it."""
        binding = self._binding(request, found.qualified, params, arguments)
        if decision.confirm and not binding.confirmed:
            asking = await self._confirmed(request, params, binding, found, arguments, decision)
            if asking is not None:
                return asking, "refused"
            binding.confirmed = True
        call = ToolCall(request, found, arguments, decision.rule, binding.rounds)
        return stepped(await binding.step(found.qualified, lambda *at: self.steps.call(call, *at)))

    async def _confirmed(
        self,
        request: AgentRequest,
        params: types.CallToolRequestParams,
        binding: SagaBinding,
        found: UpstreamTool,
        arguments: dict[str, Any],
        decision: Register,
    ) -> Answer | None:
        """The user asked before a call that cannot be undone (or that a policy asks about):
        None when they allowed it (the call goes on); else what to answer the agent (the
        question, or that it was declined). Either answer is recorded on the saga."""
        if request.stateless:
            answer = confirmations.answered(params)
            if answer is None:
                return confirmations.asked(found, arguments, decision)
        else:
            answer = await confirmations.ask_in_session(request, found, arguments, decision)
        try:
            run = await binding.opened()
        except UndoLogError as refused:
            raise NotCalled(f"tool {found.qualified} was not called: {refused}") from refused
        await confirmations.record(self.kube, run, found, answer, request.identity)
        if answer == "accept":
            return None
        return confirmations.declined(found, answer, {**binding.meta(run), SAGA_META: f"{run.namespace}/{run.name}"})

    async def close_session(self, key: str, why: str) -> None:
        """The session ended (DELETE, idle, the gateway stopping): its open saga as onClose says."""
        self.upstreams.close_session(key)
        self.changes.forget(key)
        session = self.sessions.sessions.pop(key, None)
        if session is not None and session.run is not None:
            reason = f"the agent's session ended without a commit ({why})"
            await self.own.end("onClose", SessionBinding(session), self.config.on_close, reason)

    async def reap_idle(self) -> None:
        """End sessions idle past idleSeconds (the SDK forgets them; their sagas must not wait)."""
        while True:
            await asyncio.sleep(min(self.config.idle_seconds / 4, 30.0))
            for key in self.sessions.idle():
                await self.close_session(key, f"idle for {self.config.idle_seconds:g} s")

    async def close_all(self, why: str) -> None:
        for key in list(self.sessions.sessions):
            await self.close_session(key, why)
