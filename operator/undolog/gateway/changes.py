"""What upstreams announce besides answers, passed on to every agent that wants it: a list
changing (tools, prompts, resources) and, on the stateless revision, a resource's update.

A list change: the gateway lists the upstreams' tools again, then tells session-era agents with
`notifications/<kind>/list_changed` on their sessions, and stateless ones (2026-07-28) on the
`subscriptions/listen` streams they opened with it. A resource's update reaches a stateless
agent whose listen stream names the resource: the gateway listens upstream for the resources
its agents' streams name, together (upstreams.py). Session-era agents subscribe on their own
connections (connections.py)."""

from __future__ import annotations

import contextlib
import functools
import logging
import math
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.session import ServerSession
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import (
    PromptsListChanged,
    ResourcesListChanged,
    ResourceUpdated,
    ServerEvent,
    ToolsListChanged,
)

from undolog.gateway.catalogue import ToolCatalogue, tools_of
from undolog.gateway.subscriptions import LIST_CHANGES, Subscriptions
from undolog.gateway.upstreams import Upstreams, listed_from_each, lone

log = logging.getLogger("undolog.gateway")
RELISTEN_SECONDS = 2.0  # after an upstream's listen stream dropped
CATCH_UP_SECONDS = 5.0  # an agent's listen stream waits for the upstreams to listen for its resources
MAX_NAMED, MAX_WATCHED = 100, 1_000  # resources one listen stream names; watched upstream for all
KNOWN_SESSIONS = 10_000  # agent sessions told of changes; the least recently seen forgotten first
TELL_SECONDS = 5.0  # to tell one session of a change
GONE = (MCPError, anyio.ClosedResourceError, anyio.BrokenResourceError)  # a session's stream, when it has ended
ListChange = ToolsListChanged | PromptsListChanged | ResourcesListChanged


def _told(session: ServerSession, change: ListChange) -> Callable[[], Awaitable[None]]:
    if isinstance(change, ToolsListChanged):
        return session.send_tool_list_changed
    if isinstance(change, PromptsListChanged):
        return session.send_prompt_list_changed
    return session.send_resource_list_changed


class Changes:
    def __init__(self, upstreams: Upstreams, subscriptions: Subscriptions, catalogue: ToolCatalogue) -> None:
        self.upstreams, self.catalogue = upstreams, catalogue
        self.bus = InMemorySubscriptionBus()
        self._streams = ListenHandler(self.bus)  # the stateless agents' subscriptions/listen
        self.watched: Counter[str] = Counter()  # resources named by the listen streams open
        self.sessions: OrderedDict[str, ServerSession] = OrderedDict()
        self._relisten: dict[str, anyio.CancelScope] = {}
        self._watching: dict[str, frozenset[str]] = {}  # by upstream, what its open listen stream names
        self._unlistened: set[str] = set()  # the upstreams that refused listen streams
        self._acknowledged = anyio.Event()
        self._stale = anyio.Event()  # a change of tools was announced since they were last listed
        subscriptions.on_changed = self.changed
        upstreams.background(self._relisting)
        for name in upstreams.discovered:
            upstreams.background(functools.partial(self._listening, name))

    async def _listening(self, upstream: str) -> None:
        """A listen stream to the upstream, opened again at once when the resources watched
        change, and RELISTEN_SECONDS after it drops or is not acknowledged within the upstream's
        connectSeconds (no change is replayed, so every list then counts as changed)."""
        dropped = False
        within = self.upstreams.config[upstream].connect_seconds
        while True:
            with anyio.CancelScope() as listening:
                self._relisten[upstream] = listening
                resources = frozenset(self.watched)
                try:
                    with anyio.CancelScope(deadline=anyio.current_time() + within) as opening:
                        async with self.upstreams.listening(upstream, resources) as events:
                            opening.deadline = math.inf  # open: it may stay quiet for as long as it likes
                            self._heard(upstream, resources)
                            for change in LIST_CHANGES.values() if dropped else ():
                                await self.changed(change)
                            dropped = False
                            async for event in events:
                                await self.changed(event)
                    if opening.cancelled_caught:
                        log.warning(
                            "upstream %s did not acknowledge a listen stream within %g s (its connectSeconds): "
                            "listened to again",
                            upstream,
                            within,
                        )
                except Exception as error:  # the upstream went away: listened to again
                    if self._refused(upstream, cause := lone(error)):
                        return
                    log.warning("what %s announces could not be listened to: %r", upstream, cause)
                finally:
                    self._watching.pop(upstream, None)
            if not listening.cancelled_caught:
                dropped = True
                await anyio.sleep(RELISTEN_SECONDS)

    def _refused(self, upstream: str, error: BaseException) -> bool:
        """Whether the upstream refused listen streams (-32601): then not asked again, nor waited
        for, and said once (asked every RELISTEN_SECONDS, it would refuse each time)."""
        if not (isinstance(error, MCPError) and error.code == types.METHOD_NOT_FOUND):
            return False
        self._unlistened.add(upstream)
        log.warning(
            "upstream %s refused subscriptions/listen (Method not found): not asked again, so agents learn of what "
            "it changes only when they list again",
            upstream,
        )
        return True

    def _heard(self, upstream: str, resources: frozenset[str]) -> None:
        """The upstream acknowledged a listen stream naming `resources`: whoever waits for it, on."""
        self._watching[upstream] = resources
        self._acknowledged.set()
        self._acknowledged = anyio.Event()

    async def _caught_up(self, wanted: frozenset[str]) -> None:
        """Until every upstream of the stateless revision listens for `wanted` (at most
        CATCH_UP_SECONDS: one that is away is listened to again when it is back)."""
        with anyio.move_on_after(CATCH_UP_SECONDS):
            listened = [u for u in self.upstreams.discovered if u not in self._unlistened]
            while not all(wanted <= self._watching.get(u, frozenset()) for u in listened):
                await self._acknowledged.wait()

    async def listen(
        self, ctx: ServerRequestContext[Any], params: types.SubscriptionsListenRequestParams
    ) -> types.SubscriptionsListenResult:
        """A stateless agent's listen stream, for as long as it is open; the resources it names
        watched upstream meanwhile."""
        named = list(dict.fromkeys(params.notifications.resource_subscriptions or ()))
        if len(named) > MAX_NAMED or len(set(self.watched) | set(named)) > MAX_WATCHED:
            raise MCPError(
                types.INVALID_PARAMS,
                f"subscriptions/listen: a stream names at most {MAX_NAMED} resources, and the gateway watches at "
                f"most {MAX_WATCHED} for all its agents ({len(named)} named, {len(self.watched)} watched now)",
            )
        await self._watch(named, +1)
        try:
            return await self._streams(ctx, params)
        finally:
            with anyio.CancelScope(shield=True):  # the stream's end cancels the handler
                await self._watch(named, -1)

    async def _watch(self, uris: list[str], by: int) -> None:
        """The resources watched upstream now: listened for again on each upstream of the
        stateless revision, subscribed to on the shared connection of each other one."""
        before = frozenset(self.watched)
        self.watched.update({uri: by for uri in uris})
        self.watched = +self.watched  # the counts at zero dropped
        after = frozenset(self.watched)
        if after == before:
            return
        for listening in self._relisten.values():
            listening.cancel()
        if after - before:  # the agent's stream is acknowledged once its resources are listened for
            await self._caught_up(frozenset(uris))
        for name, client in self.upstreams.clients.items():
            if name in self.upstreams.discovered:
                continue
            within = self.upstreams.config[name].call_seconds
            with anyio.move_on_after(within) as bound:  # the end's unsubscribing is shielded: never for ever
                for uri, on in [*((u, True) for u in after - before), *((u, False) for u in before - after)]:
                    with contextlib.suppress(MCPError):  # a server without subscriptions, or not its resource
                        await (client.subscribe_resource(uri) if on else client.unsubscribe_resource(uri))
            if bound.cancelled_caught:
                log.warning(
                    "upstream %s did not answer resources/subscribe or unsubscribe within %g s, and was asked to "
                    "cancel it: its updates may not reach agents; give it longer with upstreams.%s.callSeconds",
                    name,
                    within,
                    name,
                )

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
        """An upstream announced it: a resource's update to the listen streams that name it; a
        list's change to every agent, a change of tools once they are listed again."""
        if isinstance(event, ResourceUpdated):
            await self.bus.publish(event)
        elif isinstance(event, ToolsListChanged):
            self._stale.set()
        elif isinstance(event, PromptsListChanged | ResourcesListChanged):
            await self._tell(event)

    async def _relisting(self) -> None:
        """The tools listed again after a change was announced, then every agent told: one listing
        at a time, whatever announces how often, the changes announced meanwhile answered by the
        next. An upstream that does not list its tools in time keeps those it listed before."""
        while True:
            await self._stale.wait()
            self._stale = anyio.Event()
            try:
                listed, failed = await listed_from_each(self.upstreams, tools_of)
                for why in failed.values():
                    log.warning("after a change was announced, %s; the tools it listed before are kept", why)
                self.catalogue.keep(listed, self.upstreams.config)
                await self._tell(ToolsListChanged())
            except Exception:  # a defect: said, and the next change is still listed
                log.exception("the tools could not be listed again after a change was announced")

    async def _tell(self, change: ListChange) -> None:
        """The change to the stateless agents' listen streams and to every session, each within
        TELL_SECONDS (a session that takes longer, or has gone, is forgotten)."""
        await self.bus.publish(change)
        for key, session in list(self.sessions.items()):
            told = False
            with anyio.move_on_after(TELL_SECONDS), contextlib.suppress(*GONE):
                await _told(session, change)()
                told = True
            if not told:
                log.debug("session %s was not told of a list change: forgotten", key)
                self.forget(key)
