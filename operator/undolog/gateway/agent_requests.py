"""The agent's request the gateway is serving, wherever it calls an upstream from: what a
server's notifications and requests to the user during that call are sent back to (its
session, its request's stream, its progress token). Set for the length of each handler."""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar, get_args

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.session import ServerSession
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

STDIO_SESSION = "stdio"
SESSION_HEADER = "mcp-session-id"
P = TypeVar("P")
R = TypeVar("R")


LOG_LEVEL_META = "io.modelcontextprotocol/logLevel"  # a stateless request's opt-in to log messages
ASKABLE = ("sampling", "elicitation", "roots")  # what a client can be asked, if it declares it


@dataclass(frozen=True)
class AgentRequest:
    session: ServerSession
    request_id: types.RequestId | None
    session_key: str | None  # the Mcp-Session-Id, STDIO_SESSION, or None on the stateless revision
    progress_token: types.ProgressToken | None
    stateless: bool = False
    declared: frozenset[str] = frozenset()  # of ASKABLE, what the agent declared it can be asked
    log_level: types.LoggingLevel | None = None


current: contextvars.ContextVar[AgentRequest | None] = contextvars.ContextVar("undolog_agent_request", default=None)


def session_key(ctx: ServerRequestContext[Any]) -> str | None:
    """The agent's session: its Mcp-Session-Id, the one stdio connection, or none (stateless)."""
    if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
        return None
    request = ctx.request
    if request is None:
        return STDIO_SESSION
    headers = getattr(request, "headers", None)
    key = headers.get(SESSION_HEADER) if headers is not None else None
    return str(key) if key else None


def of(ctx: ServerRequestContext[Any]) -> AgentRequest:
    meta = ctx.meta or {}
    token = meta.get("progress_token")
    capabilities = ctx.session.client_capabilities
    declared = frozenset(c for c in ASKABLE if capabilities is not None and getattr(capabilities, c) is not None)
    level = meta.get(LOG_LEVEL_META)
    levels: tuple[types.LoggingLevel, ...] = get_args(types.LoggingLevel)
    return AgentRequest(
        ctx.session,
        ctx.request_id,
        session_key(ctx),
        token if isinstance(token, str | int) else None,
        stateless=ctx.protocol_version in MODERN_PROTOCOL_VERSIONS,
        declared=declared,
        log_level=next((known for known in levels if known == level), None),
    )


def serving(
    handler: Callable[[ServerRequestContext[Any], P], Awaitable[R]],
    seen: Callable[[AgentRequest], None] = lambda _: None,
) -> Callable[[ServerRequestContext[Any], P], Awaitable[R]]:
    """The handler, with its request as the current one while it runs (and `seen` first)."""

    @functools.wraps(handler)
    async def handled(ctx: ServerRequestContext[Any], params: P) -> R:
        request = of(ctx)
        seen(request)
        token = current.set(request)
        try:
            return await handler(ctx, params)
        finally:
            current.reset(token)

    return handled
