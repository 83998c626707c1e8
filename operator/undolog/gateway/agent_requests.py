"""The request the gateway is serving, as a value built once by each handler and passed to
everything that acts for it (the step, the upstream call, the connection that carries it): who
asks (the agent's session, or the operator), in which protocol era, and where what an upstream
sends back during it goes (its session, its request's stream, its progress token)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, get_args

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.session import ServerSession
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from undolog.decisions.principals import Principal

STDIO_SESSION = "stdio"
SESSION_HEADER = "mcp-session-id"
LOG_LEVEL_META = "io.modelcontextprotocol/logLevel"  # a stateless request's opt-in to log messages
ASKABLE = ("sampling", "elicitation", "roots")  # what a client can be asked, if it declares it
TASKS = "io.modelcontextprotocol/tasks"  # the tasks extension, passed through (tasks.py)
PRINCIPAL_SCOPE = "undolog.principal"  # the ASGI scope's key of the principal its token proved (protected.py)


@dataclass(frozen=True)
class AgentRequest:
    """An agent's request: `agent` tells one agent from another (its session; on the stateless
    revision, which ties nothing together, the request itself)."""

    session: ServerSession
    request_id: types.RequestId | None
    session_key: str | None  # the Mcp-Session-Id, STDIO_SESSION, or None on the stateless revision
    progress_token: types.ProgressToken | None
    stateless: bool = False
    declared: frozenset[str] = frozenset()  # of ASKABLE, what the agent declared it can be asked
    extensions: frozenset[str] = frozenset()  # of TASKS, the extensions its request declared
    log_level: types.LoggingLevel | None = None
    principal: Principal | None = None  # who calls, proved by its token (None: auth none, or stdio)

    @property
    def identity(self) -> str | None:
        """The principal's name, as handles are bound to it and the ledger records it."""
        return self.principal.name if self.principal is not None else None

    @property
    def agent(self) -> str:
        # A request in flight is alive, so its id is not another's meanwhile.
        return self.session_key if self.session_key is not None else f"request-{id(self)}"


@dataclass(frozen=True)
class OperatorRequest:
    """The operator's call of a compensation (operator_calls.py): no agent is waiting on it."""

    tool: str


Requester = AgentRequest | OperatorRequest


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
    """The request a handler serves, from the SDK's context of it."""
    meta = ctx.meta or {}
    token = meta.get("progress_token")
    capabilities = ctx.session.client_capabilities
    declared = frozenset(c for c in ASKABLE if capabilities is not None and getattr(capabilities, c) is not None)
    extensions = frozenset(e for e in (TASKS,) if capabilities is not None and e in (capabilities.extensions or {}))
    level = meta.get(LOG_LEVEL_META)
    levels: tuple[types.LoggingLevel, ...] = get_args(types.LoggingLevel)
    stateless = ctx.protocol_version in MODERN_PROTOCOL_VERSIONS
    return AgentRequest(
        ctx.session,
        ctx.request_id,
        session_key(ctx),
        token if isinstance(token, str | int) else None,
        stateless=stateless,
        declared=declared,
        extensions=extensions if stateless else frozenset(),
        log_level=next((known for known in levels if known == level), None),
        principal=principal_of(ctx),
    )


def principal_of(ctx: ServerRequestContext[Any]) -> Principal | None:
    """The principal the HTTP request's token proved; None over stdio or with `auth: none`."""
    scope = getattr(ctx.request, "scope", None)
    found = scope.get(PRINCIPAL_SCOPE) if isinstance(scope, dict) else None
    return found if isinstance(found, Principal) else None
