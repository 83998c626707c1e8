"""The MCP servers behind the gateway: one client each (the `mcp` package's), their tools, and
the calls forwarded to them with the step's Idempotency-Key (in `_meta`, and as the HTTP header
on streamable HTTP)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any, overload

import anyio
import httpx2
import mcp_types as types
from anyio.abc import TaskGroup, TaskStatus
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.client.subscriptions import Subscription
from mcp.server.session import ServerSession
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import (
    PromptsListChanged,
    ResourcesListChanged,
    ResourceUpdated,
    ServerEvent,
    ToolsListChanged,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, ConfigDict, Field

from undolog.api.gateway import GatewayConfig, Upstream
from undolog.calls.mcp import KEY_META, keyed_meta
from undolog.decisions.advertised_undo import ListedTool
from undolog.decisions.undo_expressions import expressions_in, unknown_fields
from undolog.gateway import agent_requests
from undolog.gateway.connections import Connection, progress_of

IDEMPOTENCY_HEADER = "Idempotency-Key"
STATELESS_CLIENTS = "stateless:"  # the key of the stateless agents' clients, by what they declare
LIST_CHANGES: dict[type[types.ServerNotification], ServerEvent] = {
    types.ToolListChangedNotification: ToolsListChanged(),
    types.PromptListChangedNotification: PromptsListChanged(),
    types.ResourceListChangedNotification: ResourcesListChanged(),
}
Changed = Callable[[ServerEvent], Awaitable[None]]
log = logging.getLogger("undolog.gateway")


@dataclass(frozen=True)
class UpstreamTool:
    upstream: str
    tool: types.Tool

    @property
    def qualified(self) -> str:
        """<upstream>.<tool>: how the configuration names it."""
        return f"{self.upstream}.{self.tool.name}"

    @property
    def read_only_hint(self) -> bool:
        return bool(self.tool.annotations and self.tool.annotations.read_only_hint)

    @property
    def destructive_hint(self) -> bool:
        return bool(self.tool.annotations and self.tool.annotations.destructive_hint)


async def keyed(request: httpx2.Request) -> None:
    """The HTTP header of a tools/call, from its `_meta` (the MCP client writes the body)."""
    try:
        message = json.loads(request.content or b"null")
    except ValueError:
        return
    params = message.get("params") if isinstance(message, dict) else None
    meta = params.get("_meta") if isinstance(params, dict) else None
    if isinstance(meta, dict) and isinstance(key := meta.get(KEY_META), str):
        request.headers[IDEMPOTENCY_HEADER] = key


@dataclass(frozen=True)
class Rounds:
    """A stateless agent's retry of an interactive request (2026-07-28): its answers to what the
    server asked in an `input_required` result, and the state that result carried, passed on."""

    responses: types.InputResponses | None = None
    state: str | None = None

    @classmethod
    def of(
        cls, params: types.CallToolRequestParams | types.GetPromptRequestParams | types.ReadResourceRequestParams
    ) -> Rounds:
        return cls(params.input_responses, params.request_state)


def lone(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The one exception a group holds, however deep (the group itself when it holds more)."""
    found: BaseException = group
    while isinstance(found, BaseExceptionGroup) and len(found.exceptions) == 1:
        found = found.exceptions[0]
    return found


def modern(client: Client) -> bool:
    return client.protocol_version in MODERN_PROTOCOL_VERSIONS


class RawListing(BaseModel):
    """A tools/list page with each tool as the JSON the server sent."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    tools: list[dict[str, Any]]
    next_cursor: str | None = Field(default=None, alias="nextCursor")


class Upstreams:
    """Connected at start, closed at the end; `tools` lists every upstream's tools under the name
    the agent sees (the tool's own, `<upstream>.<tool>` where two upstreams share one). Each agent
    session gets connections of its own to the HTTP upstreams (connections.py says why), opened
    on its first request that needs one and closed with the session."""

    def __init__(self, upstreams: dict[str, Upstream]) -> None:
        self.config = upstreams
        self.shared: dict[str, Connection] = {}
        self.sessions: dict[str, dict[str, Connection]] = {}
        self.subscribers: dict[str, dict[str, ServerSession]] = {}  # URI -> agent sessions subscribed to it
        self.tools: dict[str, UpstreamTool] = {}
        self.discovered: dict[str, tuple[str, types.DiscoverResult]] = {}  # upstreams of the stateless revision
        self._http: dict[str, httpx2.AsyncClient] = {}
        self.changed: Changed | None = None
        self._background: list[anyio.CancelScope] = []
        self._closing: dict[str, anyio.Event] = {}
        self._opening = anyio.Lock()
        self._stack = AsyncExitStack()
        self._tasks: TaskGroup | None = None

    async def __aenter__(self) -> Upstreams:
        try:
            self._tasks = await self._stack.enter_async_context(anyio.create_task_group())
            self._stack.callback(self._close_all)
            for name, upstream in self.config.items():
                connection = self.shared[name] = Connection(name, None, self._announced)
                connection.client = await self._stack.enter_async_context(self._connected(upstream, connection))
                if upstream.url is not None:
                    await self._discover(name, upstream.url)
            await self.list_tools()
        except BaseException:
            await self._stack.aclose()
            raise
        return self

    async def __aexit__(self, *_: object) -> None:
        await self._stack.aclose()

    @property
    def clients(self) -> dict[str, Client]:
        """The shared connections' clients, by upstream."""
        return {name: connection.ready for name, connection in self.shared.items()}

    @contextlib.asynccontextmanager
    async def _connected(self, upstream: Upstream, connection: Connection) -> AsyncIterator[Client]:
        callbacks = connection.callbacks()
        if upstream.url is not None:
            async with (
                httpx2.AsyncClient(event_hooks={"request": [keyed]}, trust_env=False, timeout=None) as http,
                Client(
                    streamable_http_client(upstream.url, http_client=http), mode="legacy", cache=None, **callbacks
                ) as client,
            ):
                yield client
            return
        assert upstream.command is not None
        command, *args = upstream.command
        parameters = StdioServerParameters(command=command, args=args, env={**os.environ, **upstream.env})
        async with Client(stdio_client(parameters), mode="legacy", cache=None, **callbacks) as client:
            yield client

    async def _discover(self, name: str, url: str) -> None:
        """Whether the upstream speaks the stateless revision: its discovery kept, so each
        stateless agent request gets a client of its own without asking again."""
        http = self._http[name] = await self._stack.enter_async_context(
            httpx2.AsyncClient(event_hooks={"request": [keyed]}, trust_env=False, timeout=None)
        )
        async with Client(streamable_http_client(url, http_client=http), mode="auto", cache=None) as probe:
            found = probe.session.discover_result
            if found is not None and modern(probe):
                self.discovered[name] = (probe.protocol_version, found)

    @contextlib.asynccontextmanager
    async def _stateless_client(
        self, upstream: str, connection: Connection, declared: frozenset[str], log_level: types.LoggingLevel | None
    ) -> AsyncIterator[Client]:
        """A client of an upstream of the stateless revision, declaring what agents declared they
        can be asked, and the log level one asked for."""
        version, found = self.discovered[upstream]
        url = self.config[upstream].url
        assert url is not None
        async with Client(
            streamable_http_client(url, http_client=self._http[upstream]),
            mode=version,
            prior_discover=found,
            cache=None,
            log_level=log_level,
            **connection.callbacks(declared),
        ) as client:
            yield client

    async def connection(self, upstream: str) -> Connection:
        """The current agent session's own connection to an HTTP upstream, else the shared one; a
        stateless agent's, one of those its upstream's clients that declare what it declared."""
        request = agent_requests.current.get()
        key = request.session_key if request is not None else None
        declared = request.declared if request is not None and request.stateless else None
        if declared is not None and upstream in self.discovered:
            key = STATELESS_CLIENTS + ",".join(sorted(declared))
        if key is None or self.config[upstream].url is None:
            return self.shared[upstream]
        async with self._opening:
            own = self.sessions.setdefault(key, {})
            if upstream not in own:
                assert self._tasks is not None
                own[upstream] = await self._tasks.start(self._held, key, upstream, declared)
            return own[upstream]

    async def _held(
        self, key: str, upstream: str, declared: frozenset[str] | None, *, task_status: TaskStatus[Connection]
    ) -> None:
        """One session's connection (or stateless agents' declaring `declared`), open until the
        session ends (a task of its own: the client's task group must end in the task that began
        it)."""
        connection = Connection(upstream, None if declared is not None else key, self._announced)
        closing = self._closing.setdefault(key, anyio.Event())
        connected = (
            self._connected(self.config[upstream], connection)
            if declared is None
            else self._stateless_client(upstream, connection, declared, None)
        )
        try:
            async with connected as client:
                connection.client = client
                task_status.started(connection)
                await closing.wait()
        except Exception as error:  # the server went away: the session gets a new connection next time
            if connection.client is None:
                raise
            log.warning("the connection of session %s to %s ended: %s", key, upstream, error)
        finally:
            if self.sessions.get(key, {}).get(upstream) is connection:
                del self.sessions[key][upstream]

    def close_session(self, key: str) -> None:
        """The session's own connections closed, its subscriptions forgotten."""
        closing = self._closing.pop(key, None)
        if closing is not None:
            closing.set()
        self.sessions.pop(key, None)
        for subscribed in self.subscribers.values():
            subscribed.pop(key, None)

    def _close_all(self) -> None:
        for scope in self._background:
            scope.cancel()
        for key in list(self._closing):
            self.close_session(key)

    @contextlib.asynccontextmanager
    async def serving(self, upstream: str) -> AsyncIterator[Client]:
        """A client of the upstream for the current agent request, which it is serving meanwhile.
        A stateless request that asked for log messages gets a client of its own: what the server
        logs comes back on the request's stream, which the SDK's client does not tell apart."""
        request = agent_requests.current.get()
        if request is not None and request.stateless and request.log_level and upstream in self.discovered:
            own = Connection(upstream, None, self._announced)
            try:
                async with self._stateless_client(upstream, own, request.declared, request.log_level) as client:
                    own.client = client
                    async with own.serving() as serving:
                        yield serving
            except BaseExceptionGroup as group:  # the client's task group wraps what the server refused
                raise lone(group) from None
            return
        connection = await self.connection(upstream)
        async with connection.serving() as client:
            yield client

    def subscribed(self, uri: str, on: bool) -> None:
        """The current agent session subscribed to (or unsubscribed from) a resource."""
        request = agent_requests.current.get()
        if request is None or request.session_key is None:
            return
        sessions = self.subscribers.setdefault(uri, {})
        if on:
            sessions[request.session_key] = request.session
        else:
            sessions.pop(request.session_key, None)

    async def _announced(self, message: types.ServerNotification, connection: Connection) -> None:
        """A resource's update to the sessions subscribed to it, and, heard on the shared
        connection, to `changed`; a list's change to `changed`, from an upstream on sessions only
        (one of the stateless revision announces what is listened for, changes.py)."""
        event: ServerEvent | None = LIST_CHANGES.get(type(message))
        if isinstance(message, types.ResourceUpdatedNotification):
            await self._updated(str(message.params.uri), connection)
            event = ResourceUpdated(str(message.params.uri))
        shared = self.shared.get(connection.upstream) is connection  # the sessions' own say it too
        if event is not None and shared and self.changed is not None and connection.upstream not in self.discovered:
            await self.changed(event)

    def background(self, run: Callable[[], Awaitable[None]]) -> None:
        """`run` in the upstreams' task group, cancelled when they close."""
        assert self._tasks is not None

        async def cancellable() -> None:
            with anyio.CancelScope() as scope:
                self._background.append(scope)
                await run()

        self._tasks.start_soon(cancellable)

    @contextlib.asynccontextmanager
    async def listening(self, upstream: str, resources: frozenset[str]) -> AsyncIterator[Subscription]:
        """A listen stream to an upstream of the stateless revision: its list changes, and the
        updates of `resources`."""
        connection = Connection(upstream, None, self._announced)
        async with (
            self._stateless_client(upstream, connection, frozenset(), None) as client,
            client.listen(
                tools_list_changed=True,
                prompts_list_changed=True,
                resources_list_changed=True,
                resource_subscriptions=sorted(resources),
            ) as events,
        ):
            yield events

    async def _updated(self, uri: str, connection: Connection) -> None:
        """A resource's update: to its subscribers (on a session's own connection, only that session)."""
        sessions = self.subscribers.get(uri, {})
        for key, session in list(sessions.items()):
            if connection.owner is None or connection.owner == key:
                with contextlib.suppress(MCPError, anyio.ClosedResourceError, anyio.BrokenResourceError):
                    await session.send_resource_updated(uri)

    async def list_tools(self) -> None:
        listed: list[UpstreamTool] = []
        for name, client in self.clients.items():
            cursor: str | None = None
            while True:
                page = await client.list_tools(cursor=cursor)
                listed.extend(UpstreamTool(name, tool) for tool in page.tools)
                cursor = page.next_cursor
                if not cursor:
                    break
        counts: dict[str, int] = {}
        for found in listed:
            counts[found.tool.name] = counts.get(found.tool.name, 0) + 1
        self.tools = {(t.tool.name if counts[t.tool.name] == 1 else t.qualified): t for t in listed}

    def qualified(self, name: str) -> UpstreamTool:
        """The tool the configuration names `<upstream>.<tool>`; KeyError when no server lists it."""
        for found in self.tools.values():
            if found.qualified == name:
                return found
        raise KeyError(f"no upstream lists {name}")

    @overload
    async def call(
        self, tool: UpstreamTool, arguments: dict[str, object], key: str | None, rounds: None = None
    ) -> types.CallToolResult: ...

    @overload
    async def call(
        self, tool: UpstreamTool, arguments: dict[str, object], key: str | None, rounds: Rounds
    ) -> types.CallToolResult | types.InputRequiredResult: ...

    async def call(
        self, tool: UpstreamTool, arguments: dict[str, object], key: str | None, rounds: Rounds | None = None
    ) -> types.CallToolResult | types.InputRequiredResult:
        """The tool called for the current agent request (its progress passed back to it). With
        `rounds` (a stateless agent's), a server of that revision may answer `input_required`:
        returned as it came, for the agent to answer."""
        meta = keyed_meta(key) if key else None
        progress = progress_of(agent_requests.current.get())
        async with self.serving(tool.upstream) as client:
            if rounds is None or not modern(client):
                return await client.call_tool(tool.tool.name, arguments, meta=meta, progress_callback=progress)
            return await client.session.call_tool(
                tool.tool.name,
                arguments,
                progress_callback=progress,
                input_responses=rounds.responses,
                request_state=rounds.state,
                meta=meta,
                allow_input_required=True,
            )


async def listed_tools(upstreams: Upstreams) -> dict[str, dict[str, ListedTool]]:
    """Every upstream's tools as the server sent them, annotations' unknown fields kept (the
    SDK's types drop them): by upstream, by tool name."""
    listed: dict[str, dict[str, ListedTool]] = {}
    for name, client in upstreams.clients.items():
        tools: dict[str, ListedTool] = listed.setdefault(name, {})
        cursor: str | None = None
        while True:
            request = types.ListToolsRequest(params=types.PaginatedRequestParams(cursor=cursor))
            page = await client.session.send_request(request, RawListing)
            for raw in page.tools:
                tool = ListedTool(
                    name=str(raw.get("name")),
                    annotations=raw.get("annotations") or {},
                    input_schema=raw.get("inputSchema") or {},
                    output_schema=raw.get("outputSchema"),
                )
                tools[tool.name] = tool
            cursor = page.next_cursor
            if not cursor:
                break
    return listed


def mapping_problems(config: GatewayConfig, upstreams: Upstreams) -> list[str]:
    """What of the mappings the servers' own lists contradict: a mapped or before-image tool no
    server lists, and an expression naming a field the tools' schemas do not declare (checked
    where a server gives the schema)."""
    listed = {t.qualified: t for t in upstreams.tools.values()}
    problems = []
    for name, rule in config.tools.items():
        tool = listed.get(name)
        before = listed.get(rule.before.tool) if rule.before else None
        if tool is None:
            problems.append(f"tools.{name}: no upstream lists {name}")
            continue
        if rule.before is not None and before is None:
            problems.append(f"tools.{name}.before: no upstream lists {rule.before.tool}")
            continue
        schemas = {"args": tool.tool.input_schema}
        if tool.tool.output_schema is not None:
            schemas["output"] = tool.tool.output_schema
        if before is not None and before.tool.output_schema is not None:
            schemas["before"] = before.tool.output_schema
        places = [(f"tools.{name}.compensation.args", rule.compensation.args if rule.compensation else {})]
        places += [(f"tools.{name}.before.args", rule.before.args)] if rule.before else []
        for where, template in places:
            problems += [f"{where}: {why}" for s in expressions_in(template) if (why := unknown_fields(s, schemas))]
    return problems
