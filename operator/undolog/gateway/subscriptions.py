"""What upstreams announce on the gateway's connections to them: a resource's update, to the
agent sessions subscribed to it (on a session's own connection, only that session); a list's
change, heard on the shared connection to an upstream on sessions, to whoever listens for list
changes (changes.py; an upstream of the stateless revision announces on a listen stream)."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable

import anyio
import mcp_types as types
from mcp.server.session import ServerSession
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import (
    PromptsListChanged,
    ResourcesListChanged,
    ResourceUpdated,
    ServerEvent,
    ToolsListChanged,
)

from undolog.gateway.agent_requests import AgentRequest
from undolog.gateway.connections import Connection

LIST_CHANGES: dict[type[types.ServerNotification], ServerEvent] = {
    types.ToolListChangedNotification: ToolsListChanged(),
    types.PromptListChangedNotification: PromptsListChanged(),
    types.ResourceListChangedNotification: ResourcesListChanged(),
}
Changed = Callable[[ServerEvent], Awaitable[None]]


class Subscriptions:
    def __init__(self) -> None:
        self.subscribers: dict[str, dict[str, ServerSession]] = {}  # URI -> agent sessions subscribed to it
        self.on_changed: Changed | None = None  # changes.py listens

    def subscribed(self, request: AgentRequest, uri: str, on: bool) -> None:
        """The request's session subscribed to (or unsubscribed from) a resource."""
        if request.session_key is None:
            return
        sessions = self.subscribers.setdefault(uri, {})
        if on:
            sessions[request.session_key] = request.session
        else:
            sessions.pop(request.session_key, None)

    def forget(self, session_key: str) -> None:
        for subscribed in self.subscribers.values():
            subscribed.pop(session_key, None)

    async def announced(self, message: types.ServerNotification, connection: Connection) -> None:
        """A resource's update to the sessions subscribed to it, and, heard on a connection that
        announces lists, to `on_changed`; a list's change to `on_changed` from such a connection."""
        event: ServerEvent | None = LIST_CHANGES.get(type(message))
        if isinstance(message, types.ResourceUpdatedNotification):
            await self._updated(str(message.params.uri), connection)
            event = ResourceUpdated(str(message.params.uri))
        if event is not None and connection.announces_lists and self.on_changed is not None:
            await self.on_changed(event)

    async def _updated(self, uri: str, connection: Connection) -> None:
        sessions = self.subscribers.get(uri, {})
        for key, session in list(sessions.items()):
            if connection.owner is None or connection.owner == key:
                with contextlib.suppress(MCPError, anyio.ClosedResourceError, anyio.BrokenResourceError):
                    await session.send_resource_updated(uri)
