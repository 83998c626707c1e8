"""The gateway's connections to the MCP servers behind it (the `mcp` package's clients), chosen
for each request by who asks and what it declared, and the calls forwarded over them with the
step's Idempotency-Key (in `_meta`, and as the HTTP header on streamable HTTP)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Annotated, TypeVar, overload

import anyio
import httpx2
import mcp_types as types
from anyio.abc import TaskGroup, TaskStatus
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.client.subscriptions import Subscription
from mcp.shared.dispatcher import ProgressFnT
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, Discriminator, Tag, TypeAdapter

from undolog.api.gateway import Upstream
from undolog.calls.mcp import KEY_META, keyed_meta
from undolog.gateway.agent_requests import TASKS, AgentRequest, Requester
from undolog.gateway.catalogue import UpstreamTool, tools_of
from undolog.gateway.connections import Connection, progress_of
from undolog.gateway.lenient_answers import LenientAnswers
from undolog.gateway.subscriptions import Subscriptions
from undolog.gateway.task_wire import TaskCreated, TasksClient
from undolog.gateway.upstream_credentials import UpstreamCredentials

IDEMPOTENCY_HEADER = "Idempotency-Key"
CLOSE_SECONDS = 5.0
STATELESS_CLIENTS = "stateless:"  # the key of the stateless agents' clients, by what they declare
log = logging.getLogger("undolog.gateway")
T = TypeVar("T")
A = TypeVar("A", bound=BaseModel)  # an answer the SDK reads into its model


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


class UpstreamUnreachable(ValueError):
    """A connection to an upstream could not be opened: at start the gateway does not start."""


def unreachable(name: str, upstream: Upstream, error: BaseException) -> UpstreamUnreachable:
    """What the upstream did, naming it, where it is and the setting that bounds the wait."""
    where = upstream.url or (upstream.command or ["?"])[0]  # not its arguments: some servers take a password there
    if isinstance(error, TimeoutError):
        return UpstreamUnreachable(
            f"upstream {name} ({where}) did not answer within {upstream.connect_seconds:g} s: check that it is up "
            f"there and speaks MCP, or give it longer with upstreams.{name}.connectSeconds"
        )
    cause = lone(error)
    return UpstreamUnreachable(f"upstream {name} ({where}) could not be connected: {type(cause).__name__}: {cause}")


def lone(error: BaseException) -> BaseException:
    """The one exception a group holds, however deep (the group itself when it holds more; any
    other exception itself)."""
    found = error
    while isinstance(found, BaseExceptionGroup) and len(found.exceptions) == 1:
        found = found.exceptions[0]
    return found


@contextlib.asynccontextmanager
async def goodbye_bounded(connected: contextlib.AbstractAsyncContextManager[Client]) -> AsyncIterator[Client]:
    """The client, whose goodbye when the block ends (its session's DELETE) is cut after
    CLOSE_SECONDS: an upstream that no longer answers does not hold up the end."""
    with anyio.CancelScope() as ending:
        async with connected as client:
            try:
                yield client
            finally:
                ending.deadline = anyio.current_time() + CLOSE_SECONDS


def modern(client: Client) -> bool:
    return client.protocol_version in MODERN_PROTOCOL_VERSIONS


class Upstreams:
    """Connected at start, closed at the end. Each agent session gets connections of its own to
    the HTTP upstreams (connections.py says why), opened on its first request that needs one and
    closed with the session; what the connections announce goes to `subscriptions`."""

    def __init__(
        self, upstreams: dict[str, Upstream], subscriptions: Subscriptions, credentials: UpstreamCredentials
    ) -> None:
        self.config, self.subscriptions, self.credentials = upstreams, subscriptions, credentials
        self.shared: dict[str, Connection] = {}
        self.sessions: dict[str, dict[str, Connection]] = {}
        self.discovered: dict[str, tuple[str, types.DiscoverResult]] = {}  # upstreams of the stateless revision
        self._http: dict[str, httpx2.AsyncClient] = {}
        self._background: list[anyio.CancelScope] = []
        self._closing: dict[str, anyio.Event] = {}
        self._closed = anyio.Event()  # the shared connections' end
        self._opening = anyio.Lock()
        self._stack = AsyncExitStack()
        self._tasks: TaskGroup | None = None

    async def __aenter__(self) -> Upstreams:
        try:
            self._tasks = await self._stack.enter_async_context(anyio.create_task_group())
            self._stack.callback(self._close_all)
            failed: list[UpstreamUnreachable] = []
            async with anyio.create_task_group() as connecting:  # all at once: the start waits for the slowest
                for name in self.config:
                    self.shared[name] = Connection(name, None, self.subscriptions.announced)
                    connecting.start_soon(self._connect_shared, name, failed)
            if failed:
                raise UpstreamUnreachable("; ".join(map(str, failed)))
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
    async def era_client(self, upstream: str, stateless: bool) -> AsyncIterator[Client]:
        """A client of the upstream: of the stateless revision where `stateless` and it speaks it
        (opened for the while), else its shared one of the session era."""
        if not (stateless and upstream in self.discovered):
            yield self.shared[upstream].ready
            return
        async with self._own(upstream, frozenset(), None) as own:
            yield own.ready

    @contextlib.asynccontextmanager
    async def _connected(self, upstream: Upstream, connection: Connection) -> AsyncIterator[Client]:
        callbacks = connection.callbacks()
        if upstream.url is not None:
            async with (
                self._http_client(connection.upstream) as http,
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

    def _http_client(self, upstream: str) -> httpx2.AsyncClient:
        """An HTTP client of the upstream: each request with its Idempotency-Key and the gateway's credentials."""
        hooks = [keyed, *self.credentials.hooks(upstream)]
        tls = self.credentials.tls(upstream)
        transport = LenientAnswers(httpx2.AsyncHTTPTransport(verify=tls, trust_env=False))
        return httpx2.AsyncClient(event_hooks={"request": hooks}, trust_env=False, timeout=None, transport=transport)

    async def _discover(self, name: str, url: str) -> None:
        """Whether the upstream speaks the stateless revision: its discovery kept, so each
        stateless agent request gets a client of its own without asking again."""
        http = self._http[name] = await self._stack.enter_async_context(self._http_client(name))
        async with Client(streamable_http_client(url, http_client=http), mode="auto", cache=None) as probe:
            found = probe.session.discover_result
            if found is not None and modern(probe):
                self.discovered[name] = (probe.protocol_version, found)

    @contextlib.asynccontextmanager
    async def _own(
        self, upstream: str, declared: frozenset[str], log_level: types.LoggingLevel | None
    ) -> AsyncIterator[Connection]:
        """A connection of its own to an upstream of the stateless revision, open for the while."""
        connection = Connection(upstream, None, self.subscriptions.announced)
        async with self._stateless_client(upstream, connection, declared, log_level) as client:
            connection.client = client
            yield connection

    @contextlib.asynccontextmanager
    async def _stateless_client(
        self, upstream: str, connection: Connection, declared: frozenset[str], log_level: types.LoggingLevel | None
    ) -> AsyncIterator[Client]:
        """A client of an upstream of the stateless revision, declaring what agents declared they
        can be asked and the extensions they declared, and the log level one asked for."""
        version, found = self.discovered[upstream]
        url = self.config[upstream].url
        assert url is not None
        async with Client(
            streamable_http_client(url, http_client=self._http[upstream]),
            mode=version,
            prior_discover=found,
            cache=None,
            log_level=log_level,
            extensions=[TasksClient()] if TASKS in declared else [],
            **connection.callbacks(declared),
        ) as client:
            yield client

    async def connection(self, request: Requester, upstream: str) -> Connection:
        """The agent session's own connection to an HTTP upstream, else the shared one; a
        stateless agent's, one of those its upstream's clients that declare what it declared."""
        agent = request if isinstance(request, AgentRequest) else None
        key = agent.session_key if agent is not None else None
        declared = agent.declared | agent.extensions if agent is not None and agent.stateless else None
        if declared is not None and upstream in self.discovered:
            key = STATELESS_CLIENTS + ",".join(sorted(declared))
        if key is None or self.config[upstream].url is None:
            return self.shared[upstream]
        async with self._opening:
            own = self.sessions.setdefault(key, {})
            if upstream not in own:
                assert self._tasks is not None
                said = self.config[upstream]
                try:
                    with anyio.fail_after(said.connect_seconds):
                        own[upstream] = await self._tasks.start(self._held, key, upstream, declared)
                except TimeoutError as error:  # held no longer than that: the lock holds every session's opening
                    raise unreachable(upstream, said, error) from None
            return own[upstream]

    async def _held(
        self, key: str, upstream: str, declared: frozenset[str] | None, *, task_status: TaskStatus[Connection]
    ) -> None:
        """One session's connection (or stateless agents' declaring `declared`), open until the
        session ends (a task of its own: the client's task group must end in the task that began
        it)."""
        connection = Connection(upstream, None if declared is not None else key, self.subscriptions.announced)
        closing = self._closing.setdefault(key, anyio.Event())
        connected = (
            self._connected(self.config[upstream], connection)
            if declared is None
            else self._stateless_client(upstream, connection, declared, None)
        )
        try:
            async with goodbye_bounded(connected) as client:
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

    async def _connect_shared(self, name: str, failed: list[UpstreamUnreachable]) -> None:
        """The upstream's shared connection opened and its era discovered, within its
        connectSeconds; else why not, in `failed`."""
        upstream = self.config[name]
        assert self._tasks is not None
        try:
            with anyio.fail_after(upstream.connect_seconds):
                await self._tasks.start(self._held_shared, name)
                if upstream.url is not None:
                    await self._discover(name, upstream.url)
        except Exception as error:
            failed.append(unreachable(name, upstream, error))
            return
        self.shared[name].announces_lists = name not in self.discovered

    async def _held_shared(self, name: str, *, task_status: TaskStatus[None]) -> None:
        """The upstream's shared connection, open until the upstreams close (a task of its own, as
        a session's: `_held`)."""
        connection = self.shared[name]
        async with goodbye_bounded(self._connected(self.config[name], connection)) as client:
            connection.client = client
            task_status.started()
            await self._closed.wait()

    def close_session(self, key: str) -> None:
        """The session's own connections closed, its subscriptions forgotten."""
        closing = self._closing.pop(key, None)
        if closing is not None:
            closing.set()
        self.sessions.pop(key, None)
        self.subscriptions.forget(key)

    def _close_all(self) -> None:
        self._closed.set()
        for scope in self._background:
            scope.cancel()
        for key in list(self._closing):
            self.close_session(key)

    @contextlib.asynccontextmanager
    async def serving(self, request: Requester, upstream: str, tasks: bool = False) -> AsyncIterator[Client]:
        """A client of the upstream for `request`, which it is serving meanwhile. A stateless
        request that asked for log messages gets a client of its own: what the server logs comes
        back on the request's stream, which the SDK's client does not tell apart; so does the
        operator's request of a task (`tasks`: declaring the tasks extension)."""
        agent = request if isinstance(request, AgentRequest) else None
        own: tuple[frozenset[str], types.LoggingLevel | None] | None = None
        if agent is None and tasks:
            own = frozenset({TASKS}), None
        elif agent is not None and agent.stateless and agent.log_level:
            own = agent.declared | agent.extensions, agent.log_level
        if own is not None and upstream in self.discovered:
            try:
                async with self._own(upstream, *own) as connection, connection.serving(request) as serving:
                    yield serving
            except BaseExceptionGroup as group:  # the client's task group wraps what the server refused
                raise lone(group) from None
            return
        connection = await self.connection(request, upstream)
        async with connection.serving(request) as client:
            yield client

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
        async with (
            self._own(upstream, frozenset(), None) as own,
            own.ready.listen(
                tools_list_changed=True,
                prompts_list_changed=True,
                resources_list_changed=True,
                resource_subscriptions=sorted(resources),
            ) as events,
        ):
            yield events

    @overload
    async def call(
        self,
        request: Requester,
        tool: UpstreamTool,
        arguments: dict[str, object],
        key: str | None,
        rounds: None = None,
    ) -> types.CallToolResult: ...

    @overload
    async def call(
        self, request: Requester, tool: UpstreamTool, arguments: dict[str, object], key: str | None, rounds: Rounds
    ) -> Answer: ...

    async def call(
        self,
        request: Requester,
        tool: UpstreamTool,
        arguments: dict[str, object],
        key: str | None,
        rounds: Rounds | None = None,
    ) -> Answer:
        """The tool called for `request` (its progress passed back to it). With `rounds` (a
        stateless agent's), a server of that revision may answer `input_required`, or with a
        task when the agent declared the tasks extension: returned as it came, for the agent.
        Past the upstream's callSeconds, an MCPError saying so (the server is asked to cancel)."""
        meta = keyed_meta(key) if key else None
        progress = progress_of(request)

        async def called(client: Client) -> Answer:
            if not modern(client):
                params = types.CallToolRequestParams(name=tool.tool.name, arguments=arguments, _meta=meta)
                return await called_as_it_came(client, params, progress, SESSION_ANSWER)
            if rounds is None:
                return await client.call_tool(tool.tool.name, arguments, meta=meta, progress_callback=progress)
            return await called_in_rounds(client, tool, arguments, meta, progress, rounds)

        return await asked(self, request, tool.upstream, called, tool.tool.name)


async def asked(
    upstreams: Upstreams,
    request: Requester,
    upstream: str,
    ask: Callable[[Client], Awaitable[T]],
    what: str,
    *,
    tasks: bool = False,
) -> T:
    """`ask` of the upstream's client serving `request` (`Upstreams.serving`), answered within the
    upstream's callSeconds; else an MCPError saying so (the SDK asks the server to cancel), also
    logged: a list that leaves the upstream out says nothing of it to the agent."""
    within = upstreams.config[upstream].call_seconds
    with anyio.move_on_after(within):
        async with upstreams.serving(request, upstream, tasks) as client:
            return await ask(client)
    said = (
        f"upstream {upstream} did not answer {what} within {within:g} s, and was asked to cancel it: give it "
        f"longer with upstreams.{upstream}.callSeconds"
    )
    log.warning("%s", said)
    raise MCPError(types.INTERNAL_ERROR, said)


SESSION_ANSWER = TypeAdapter(types.CallToolResult)
Answer = types.CallToolResult | types.InputRequiredResult | TaskCreated  # a tool call's, as it came


def by_result_type(*arms: str) -> Discriminator:
    """The arm of a tool call's answer: its resultType when that is one of `arms`, else the core
    arm, `complete` (whose model refuses what it is not)."""

    def arm(answer: object) -> str:
        tag = answer.get("resultType") if isinstance(answer, dict) else getattr(answer, "result_type", None)
        return tag if tag in arms else "complete"

    return Discriminator(arm)


# A tool call's answers on the stateless revision; a task only to a client that declared the
# tasks extension (to any other it is no result the client can take).
IN_ROUNDS: TypeAdapter[Answer] = TypeAdapter(
    Annotated[
        Annotated[types.CallToolResult, Tag("complete")] | Annotated[types.InputRequiredResult, Tag("input_required")],
        by_result_type("input_required"),
    ]
)
IN_ROUNDS_OR_TASK: TypeAdapter[Answer] = TypeAdapter(
    Annotated[
        Annotated[types.CallToolResult, Tag("complete")]
        | Annotated[types.InputRequiredResult, Tag("input_required")]
        | Annotated[TaskCreated, Tag("task")],
        by_result_type("input_required", "task"),
    ]
)


async def called_as_it_came(
    client: Client, params: types.CallToolRequestParams, progress: ProgressFnT | None, answers: TypeAdapter[A]
) -> A:
    """The tool called, its answer passed on as it came. The SDK's call would first list the
    tools on a client that has not (each session's own connection, each stateless client), to
    check the result against the tool's output schema: a round trip per client and upstream,
    and a wait as long as the server's tools/list; the agent's client checks it all the same."""
    return await client.session.send_request(types.CallToolRequest(params=params), answers, progress_callback=progress)


async def called_in_rounds(
    client: Client,
    tool: UpstreamTool,
    arguments: dict[str, object],
    meta: types.RequestParamsMeta | None,
    progress: ProgressFnT | None,
    rounds: Rounds,
) -> Answer:
    """The tool called on a server of the stateless revision, which may answer `input_required`,
    or with a task: returned as it came. Refused for want of the `Mcp-Param-*` headers its
    schema names (-32020), the tool is listed on this client, and sent again once."""
    params = types.CallToolRequestParams(
        name=tool.tool.name,
        arguments=arguments,
        input_responses=rounds.responses,
        request_state=rounds.state,
        _meta=meta,
    )
    tasks = any(isinstance(extension, TasksClient) for extension in client.extensions or ())
    answers = IN_ROUNDS_OR_TASK if tasks else IN_ROUNDS
    try:
        return await called_as_it_came(client, params, progress, answers)
    except MCPError as mismatch:
        if mismatch.code != types.HEADER_MISMATCH:
            raise
        # The SDK sends the headers its own listing names; this client's was missing or stale. The
        # refusal comes before the tool runs, so sending again is the specification's recovery.
        await tools_of(client)
        return await called_as_it_came(client, params, progress, answers)


async def listed_from_each(
    upstreams: Upstreams, read: Callable[[Client], Awaitable[T]]
) -> tuple[dict[tuple[str, bool], T], dict[str, str]]:
    """What `read` lists from each upstream, by upstream and era (stateless or not): for each era
    it speaks, all at once, each within its connectSeconds. Also why any failed, by upstream."""
    listed: dict[tuple[str, bool], T] = {}
    failed: dict[str, str] = {}

    async def one(name: str, stateless: bool) -> None:
        within = upstreams.config[name].connect_seconds
        try:
            with anyio.fail_after(within):
                async with upstreams.era_client(name, stateless) as client:
                    listed[name, stateless] = await read(client)
        except TimeoutError:
            failed[name] = (
                f"upstream {name} did not list its tools within {within:g} s: check that it answers tools/list, "
                f"or give it longer with upstreams.{name}.connectSeconds"
            )
        except Exception as error:
            cause = lone(error)
            failed[name] = f"upstream {name} could not list its tools: {type(cause).__name__}: {cause}"
        if (name, False) in listed and name not in upstreams.discovered:  # one era: one list for both
            listed[name, True] = listed[name, False]

    async with anyio.create_task_group() as listing:
        for name in upstreams.config:
            for stateless in (False, True) if name in upstreams.discovered else (False,):
                listing.start_soon(one, name, stateless)
    return listed, failed


async def listed_from_all(upstreams: Upstreams, read: Callable[[Client], Awaitable[T]]) -> dict[tuple[str, bool], T]:
    """What `read` lists from each upstream (`listed_from_each`), or UpstreamUnreachable naming
    every upstream that failed: the gateway does not start without them."""
    listed, failed = await listed_from_each(upstreams, read)
    if failed:
        raise UpstreamUnreachable("; ".join(failed.values()))
    return listed
