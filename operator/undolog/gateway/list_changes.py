"""An upstream's lists changing (its tools, prompts, resources), passed on to every agent: the
gateway lists the upstreams' tools again, then tells session-era agents with
`notifications/<kind>/list_changed` on their sessions, and stateless ones (2026-07-28) on the
`subscriptions/listen` streams they opened with it. Upstreams announce their changes on the
gateway's shared connection (sessions) or on a listen stream the gateway keeps open to each
upstream of the stateless revision (upstreams.py)."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable

import anyio
from mcp.server.session import ServerSession
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import PromptsListChanged, ResourcesListChanged, ServerEvent, ToolsListChanged

from undolog.gateway.upstreams import Upstreams

log = logging.getLogger("undolog.gateway")
KNOWN_SESSIONS = 10_000  # agent sessions told of changes; the least recently seen forgotten first
ListChange = ToolsListChanged | PromptsListChanged | ResourcesListChanged


def _told(session: ServerSession, change: ListChange) -> Callable[[], Awaitable[None]]:
    if isinstance(change, ToolsListChanged):
        return session.send_tool_list_changed
    if isinstance(change, PromptsListChanged):
        return session.send_prompt_list_changed
    return session.send_resource_list_changed


class ListChanges:
    def __init__(self, upstreams: Upstreams) -> None:
        self.upstreams = upstreams
        self.bus = InMemorySubscriptionBus()
        self.listen = ListenHandler(self.bus)  # serves the stateless agents' subscriptions/listen
        self.sessions: OrderedDict[str, ServerSession] = OrderedDict()

    def seen(self, key: str | None, session: ServerSession) -> None:
        """A session-era agent's session, to tell of changes until it ends."""
        if key is None:
            return
        self.sessions[key] = session
        self.sessions.move_to_end(key)
        while len(self.sessions) > KNOWN_SESSIONS:
            self.sessions.popitem(last=False)

    def forget(self, key: str) -> None:
        self.sessions.pop(key, None)

    async def changed(self, event: ServerEvent) -> None:
        """An upstream's list changed: the tools listed again, then every agent told."""
        if not isinstance(event, ToolsListChanged | PromptsListChanged | ResourcesListChanged):
            return
        if isinstance(event, ToolsListChanged):
            await self.upstreams.list_tools()
        await self.bus.publish(event)
        for key, session in list(self.sessions.items()):
            try:
                await _told(session, event)()
            except (MCPError, anyio.ClosedResourceError, anyio.BrokenResourceError) as gone:
                log.debug("session %s was not told of a list change (%s): forgotten", key, gone)
                self.forget(key)
