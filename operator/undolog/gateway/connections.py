"""Connections to an upstream and what comes back on them besides answers: a server's log
messages, progress, requests to the user (sampling, elicitation) and resource updates, passed to
the agent whose request the server is serving.

A server says nothing of which of its client's requests a message belongs to, so the gateway
gives each agent session a connection of its own to each HTTP upstream: what arrives on it
belongs to that session, and within it to the request the session is waiting on (the latest,
when it waits on several). A stdio upstream is one process with one connection, shared by every
agent and by the operator's compensations: what arrives goes to the request in flight on it
while those in flight are one agent's; while several agents' are, or the operator's, the server
does not say whose it is, so it is dropped (and logged), never delivered to another agent. A
request to the user that reaches no agent able to answer is refused to the server.

A stateless agent's request (2026-07-28) to an upstream that speaks that revision goes over a
client declaring what the agent declared it can be asked (upstreams.py): the server asks through
an `input_required` result, which goes back to the agent as it came, and the agent's answers go
to the server on its retry.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import mcp_types as types
from mcp import Client
from mcp.client.session import ClientRequestContext, IncomingMessage
from mcp.shared.dispatcher import ProgressFnT
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ServerMessageMetadata

from undolog.gateway.agent_requests import AgentRequest, OperatorRequest, Requester

log = logging.getLogger("undolog.gateway")
A = TypeVar("A", types.CreateMessageResult, types.ElicitResult, types.ListRootsResult)
Announced = Callable[[types.ServerNotification, "Connection"], Awaitable[None]]  # on this connection
SHARED_ASKABLE = frozenset({"sampling", "elicitation"})
ANNOUNCEMENTS = (
    types.ResourceUpdatedNotification,
    types.ToolListChangedNotification,
    types.PromptListChangedNotification,
    types.ResourceListChangedNotification,
)


class Connection:
    """One MCP client of one upstream, and the requests it is serving now."""

    def __init__(self, upstream: str, owner: str | None, announced: Announced) -> None:
        self.upstream, self.owner, self.announced = upstream, owner, announced  # owner: the agent session, if its own
        self.client: Client | None = None
        self.announces_lists = False  # the shared connection to an upstream on sessions: its list changes count
        self.in_flight: list[Requester] = []
        self.last: AgentRequest | None = None  # the owner's latest request: its session, when none is in flight

    @property
    def ready(self) -> Client:
        assert self.client is not None, f"the connection to {self.upstream} is not open"
        return self.client

    @contextlib.asynccontextmanager
    async def serving(self, request: Requester) -> AsyncIterator[Client]:
        """The client, with `request` in flight on it meanwhile."""
        self.in_flight.append(request)
        if isinstance(request, AgentRequest):
            self.last = request
        try:
            yield self.ready
        finally:
            self.in_flight.remove(request)

    def target(self, what: str) -> AgentRequest | None:
        """The agent request what the server sends now belongs to: the latest in flight when
        every request in flight is one agent's; none (`what` dropped, and logged) when they are
        several agents' or the operator's, since the server does not say whose it is."""
        agents = {r.agent if isinstance(r, AgentRequest) else None for r in self.in_flight}
        latest = self.in_flight[-1] if self.in_flight else None
        if len(agents) == 1 and isinstance(latest, AgentRequest):
            return latest
        if not self.in_flight and self.last is not None and self.owner is not None:
            return AgentRequest(self.last.session, None, self.owner, None)
        if self.in_flight:
            log.info("%s from %s dropped: %s", what, self.upstream, self._whose())
        return None

    def _whose(self) -> str:
        if any(isinstance(r, OperatorRequest) for r in self.in_flight):
            return "the operator's compensation is in flight on its connection, and no agent waits on it"
        return f"{len(self.in_flight)} requests of different agents are in flight on its connection"

    def callbacks(self, declared: frozenset[str] = SHARED_ASKABLE) -> dict[str, Any]:
        """The upstream client's callbacks; they also declare what it can be asked: sampling and
        elicitation on a session's connection (not roots: the filesystem server asks for them as
        soon as it is connected, before any agent could answer), what the agent declared on a
        request's own."""
        askable = {
            "sampling_callback": ("sampling", self.sampling),
            "elicitation_callback": ("elicitation", self.elicitation),
            "list_roots_callback": ("roots", self.list_roots),
        }
        asked = {name: f for name, (can, f) in askable.items() if can in declared}
        return {**asked, "logging_callback": self.logged, "message_handler": self.notified}

    async def sampling(
        self, context: ClientRequestContext, params: types.CreateMessageRequestParams
    ) -> types.CreateMessageResult | types.ErrorData:
        return await self._ask(types.CreateMessageRequest(params=params), types.CreateMessageResult)

    async def elicitation(
        self, context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult | types.ErrorData:
        return await self._ask(types.ElicitRequest(params=params), types.ElicitResult)

    async def list_roots(self, context: ClientRequestContext) -> types.ListRootsResult | types.ErrorData:
        return await self._ask(types.ListRootsRequest(), types.ListRootsResult)

    async def _ask(self, request: types.ServerRequest, answer: type[A]) -> A | types.ErrorData:
        target = self.target(request.method)
        if target is None:
            return types.ErrorData(
                code=types.INVALID_REQUEST,
                message="the gateway cannot tell which agent's request this belongs to, so no agent is asked",
            )
        try:
            related = ServerMessageMetadata(related_request_id=target.request_id)
            return await target.session.send_request(request, answer, metadata=related)
        except MCPError as refused:
            return refused.error

    async def logged(self, params: types.LoggingMessageNotificationParams) -> None:
        target = self.target("a log message")
        if target is not None:
            with contextlib.suppress(MCPError):  # the agent's stream is gone: the message with it
                await target.session.send_log_message(
                    params.level, params.data, params.logger, related_request_id=target.request_id
                )

    async def notified(self, message: IncomingMessage) -> None:
        """What the server announces besides answers (a resource's update, a list's change)."""
        if isinstance(message, ANNOUNCEMENTS):
            await self.announced(message, self)


def progress_of(target: Requester) -> ProgressFnT | None:
    """The upstream call's progress, passed on under the agent's own token (when it gave one)."""
    if not isinstance(target, AgentRequest) or target.progress_token is None:
        return None
    token = target.progress_token

    async def progressed(progress: float, total: float | None, message: str | None) -> None:
        with contextlib.suppress(MCPError):  # the agent's stream is gone: its progress with it
            await target.session.send_progress_notification(
                token, progress, total, message, related_request_id=str(target.request_id)
            )

    return progressed
