"""The compensation tools of stdio upstreams, served to the operator at
/upstreams/<upstream>/mcp: the operator calls an MCP tool at a URL, and a server the gateway
starts as a command has none. The operator's Webhook points there (`url:
http://<gateway>:8090/upstreams/files/mcp`, `mcp: {tool: write_file}`), and its call meets the
operator's own egress policy, timeouts, retries and signing as any call does.

Here each request is checked as a participant checks the operator's calls (the participant
kit's barrier): its Standard Webhooks signature, with the keys of the Webhooks' signing Secret
(`operatorCalls.signingSecretsDir`), and its fence (`Undolog-Fence`, refused when lower than the
highest this replica has seen for its shard). Only the tools the configuration names as
compensations are listed and called; the call's Idempotency-Key reaches the tool in `_meta`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.exceptions import MCPError
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from undolog.api.gateway import GatewayConfig
from undolog.calls.mcp import KEY_META
from undolog.gateway.upstreams import Upstreams, UpstreamTool
from undolog.participant.barrier import Answer, Barrier, Call

PATH = "/upstreams/{upstream}/mcp"
MAX_BODY_BYTES = 1024 * 1024  # the operator's arguments are capped far below this


def compensation_tools(config: GatewayConfig, upstreams: Upstreams) -> dict[str, dict[str, UpstreamTool]]:
    """By stdio upstream, the tools the configuration names as compensations (or before-images
    are not: the operator never calls those)."""
    served: dict[str, dict[str, UpstreamTool]] = {}
    for rule in config.tools.values():
        named = rule.compensation.tool if rule.compensation else None
        if named is None or config.upstreams[named.split(".", 1)[0]].command is None:
            continue
        found = upstreams.qualified(named)
        served.setdefault(found.upstream, {})[found.tool.name] = found
    return served


class MemoryFences:
    """The highest fence seen per shard, in this replica's memory (the Service keeps an
    operator's calls on one replica; a restarted gateway learns the fence again from the next call)."""

    def __init__(self) -> None:
        self.highest: dict[str, int] = {}

    async def fence(self, shard: str, fence: int) -> int:
        self.highest[shard] = max(self.highest.get(shard, fence), fence)
        return self.highest[shard]


def signing_keys(folder: str | None) -> list[str]:
    """Every key of the mounted Secret, read again on each call (the operator rotates them)."""
    if folder is None:
        return []
    return [p.read_text().strip() for p in sorted(Path(folder).iterdir()) if p.is_file() and not p.name.startswith(".")]


class OperatorCalls:
    """The ASGI route and the MCP server behind it; `running()` for the lifetime of the app."""

    def __init__(self, config: GatewayConfig, upstreams: Upstreams) -> None:
        self.config, self.upstreams = config, upstreams
        self.tools = compensation_tools(config, upstreams)
        self.fences = MemoryFences()
        server: Server[Any] = Server("undolog-gateway-operator-calls", on_list_tools=self.list, on_call_tool=self.call)
        self.manager = StreamableHTTPSessionManager(app=server, stateless=True, json_response=True)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        async with self.manager.run():
            yield

    def route(self) -> Route:
        return Route(PATH, endpoint=self, methods=["GET", "POST", "DELETE"])  # an instance: served as ASGI

    def _served(self, ctx: ServerRequestContext[Any]) -> dict[str, UpstreamTool]:
        request = ctx.request
        path = str(getattr(request, "url", "")).split("/upstreams/", 1)[-1]
        return self.tools.get(path.split("/", 1)[0], {})

    async def list(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[found.tool for found in self._served(ctx).values()])

    async def call(self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> types.CallToolResult:
        found = self._served(ctx).get(params.name)
        if found is None:
            raise MCPError(types.INVALID_PARAMS, f"{params.name!r} is not a compensation the gateway serves here")
        meta = dict(params.meta or {})
        key = meta.get(KEY_META)
        return await self.upstreams.call(found, dict(params.arguments or {}), key if isinstance(key, str) else None)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        upstream = scope.get("path_params", {}).get("upstream")
        if upstream not in self.tools:
            return await answer(send, Answer(404, {"error": f"no stdio upstream {upstream!r} has a compensation here"}))
        body = await read_body(receive)
        if body is None:
            return await answer(send, Answer(413, {"error": f"a request over {MAX_BODY_BYTES} bytes"}))
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        call = Call(headers, body)
        barrier = Barrier(signing_keys(self.config.operator_calls.signing_secrets_dir))
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
