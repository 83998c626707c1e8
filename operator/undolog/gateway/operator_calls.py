"""The compensation tools of stdio upstreams (and of upstreams the gateway holds credentials
for), served to the operator at <operatorCalls.url>/upstreams/<upstream>/mcp: the operator calls
an MCP tool at a URL, and a server the gateway starts as a command has none. The gateway keeps a
Webhook for each such tool (operator_webhooks.py), so the operator's call meets its own egress
policy, timeouts, retries and signing as any call does.

Here each request is checked as a participant checks the operator's calls (the participant
kit's barrier): its Standard Webhooks signature, with that Secret's keys, and its fence
(`Undolog-Fence`, refused when lower than the highest this replica has seen for its shard). Only
the tools the configuration names as compensations are listed and called; the call's
Idempotency-Key reaches the tool in `_meta`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.exceptions import MCPError
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from undolog.api.gateway import GatewayConfig, webhook_of
from undolog.calls.mcp import KEY_META
from undolog.errors import KubeError
from undolog.gateway.agent_requests import OperatorRequest
from undolog.gateway.catalogue import ToolCatalogue, UpstreamTool
from undolog.gateway.upstreams import Upstreams
from undolog.kube import Kube
from undolog.participant.barrier import Answer, Barrier, Call

PATH = "/upstreams/{upstream}/mcp"
MAX_BODY_BYTES = 1024 * 1024  # the operator's arguments are capped far below this
KEYS_FOR_SECONDS = 10.0  # the signing Secret read again at most this often (a rotation shows within it)
MANAGED_BY = ("app.kubernetes.io/managed-by", "undolog-gateway")
log = logging.getLogger("undolog.gateway")


@dataclass(frozen=True)
class Served:
    """A compensation tool of a stdio upstream, and the Webhook version the operator calls it by."""

    found: UpstreamTool
    webhook: str
    version: str


def compensation_tools(config: GatewayConfig, catalogue: ToolCatalogue) -> dict[str, dict[str, Served]]:
    """By upstream and tool name, the tools the configuration names as compensations (and the
    reads of their guards) of the upstreams the operator cannot call itself: those run as
    commands, and those the gateway holds credentials for (the undo then carries the same
    credential as the call)."""
    served: dict[str, dict[str, Served]] = {}
    for rule in config.tools.values():
        undo, read = rule.compensation, rule.guard_read
        named = [(undo.tool, undo.webhook, undo.version)] if undo is not None and undo.tool is not None else []
        named += [(read.tool, webhook_of(read.tool), "v1")] if read is not None and rule.after is not None else []
        for tool, webhook, version in named:
            upstream = config.upstreams[tool.split(".", 1)[0]]
            if upstream.command is None and upstream.credentials is None:
                continue
            found = catalogue.qualified(tool)
            served.setdefault(found.upstream, {})[found.tool.name] = Served(found, webhook, version)
    return served


class MemoryFences:
    """The highest fence seen per shard, in this replica's memory (the Service keeps an
    operator's calls on one replica; a restarted gateway learns the fence again from the next call)."""

    def __init__(self) -> None:
        self.highest: dict[str, int] = {}

    async def fence(self, shard: str, fence: int) -> int:
        self.highest[shard] = max(self.highest.get(shard, fence), fence)
        return self.highest[shard]


class SigningKeys:
    """The signing Secret's keys, read through the API at most every KEYS_FOR_SECONDS."""

    def __init__(self, kube: Kube, namespace: str, secret: str | None) -> None:
        self.kube, self.namespace, self.secret = kube, namespace, secret
        self.keys: list[str] = []
        self.read_at = float("-inf")

    async def current(self) -> list[str]:
        if self.secret is None or time.monotonic() - self.read_at < KEYS_FOR_SECONDS:
            return self.keys
        _, data = await self.kube.secret(self.namespace, self.secret)
        self.keys = [value.decode().strip() for _, value in sorted(data.items())]
        self.read_at = time.monotonic()
        return self.keys


class OperatorCalls:
    """The ASGI route (the instance itself) and the MCP server behind it; `running()` for the
    lifetime of the app (operator_webhooks.py keeps the Webhooks that lead the operator here)."""

    def __init__(self, config: GatewayConfig, upstreams: Upstreams, catalogue: ToolCatalogue, kube: Kube) -> None:
        self.config, self.upstreams, self.kube = config, upstreams, kube
        self.tools = compensation_tools(config, catalogue)
        self.fences = MemoryFences()
        self.keys = SigningKeys(kube, config.namespace, config.operator_calls.signing_secret)
        server: Server[Any] = Server("undolog-gateway-operator-calls", on_list_tools=self.list, on_call_tool=self.call)
        self.manager = StreamableHTTPSessionManager(app=server, stateless=True, json_response=True)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        async with self.manager.run():
            yield

    def route(self) -> Route:
        return Route(PATH, endpoint=self, methods=["GET", "POST", "DELETE"])  # an instance: served as ASGI

    def _served(self, ctx: ServerRequestContext[Any]) -> dict[str, Served]:
        path = str(getattr(ctx.request, "url", "")).split("/upstreams/", 1)[-1]
        return self.tools.get(path.split("/", 1)[0], {})

    async def list(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[served.found.tool for served in self._served(ctx).values()])

    async def call(self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> types.CallToolResult:
        served = self._served(ctx).get(params.name)
        if served is None:
            raise MCPError(types.INVALID_PARAMS, f"{params.name!r} is not a compensation the gateway serves here")
        key = dict(params.meta or {}).get(KEY_META)
        request = OperatorRequest(served.found.qualified)
        return await self.upstreams.call(
            request, served.found, dict(params.arguments or {}), key if isinstance(key, str) else None
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        upstream = scope.get("path_params", {}).get("upstream")
        if upstream not in self.tools:
            return await answer(
                send, Answer(404, {"error": f"no upstream {upstream!r} has a compensation served here"})
            )
        body = await read_body(receive)
        if body is None:
            return await answer(send, Answer(413, {"error": f"a request over {MAX_BODY_BYTES} bytes"}))
        secret = self.config.operator_calls.signing_secret
        try:
            keys = await self.keys.current()
        except KubeError as error:
            return await answer(send, Answer(503, {"error": f"the signing Secret {secret} could not be read: {error}"}))
        if secret and not keys:
            return await answer(send, Answer(503, {"error": f"the signing Secret {secret} holds no key"}))
        barrier = Barrier(keys)
        call = Call({k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}, body)
        refused = barrier.refused(call) or await barrier.stale(self.fences, call)
        if refused is not None:
            return await answer(send, refused)
        await self.manager.asgi_app(scope, replay(body, receive), send)


async def read_body(receive: Receive) -> bytes | None:
    """The whole request body; None when it is over MAX_BODY_BYTES."""
    body = b""
    while True:
        message = await receive()
        body += bytes(message.get("body", b""))
        if len(body) > MAX_BODY_BYTES:
            return None
        if not message.get("more_body"):
            return body


def replay(body: bytes, receive: Receive) -> Receive:
    """The body once again, then the client's own messages (its disconnect)."""
    sent = False

    async def again() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again


async def answer(send: Send, refused: Answer) -> None:
    payload = refused.encoded()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    await send({"type": "http.response.start", "status": refused.status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})
