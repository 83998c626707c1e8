"""Sessions are sagas: an agent's MCP session (protocol 2025-11-25 and earlier) gets a saga with
its first mapped tool call, and the saga ends with the agent's `undolog_commit` or
`undolog_abort`, or, when the session ends without either, as the configuration says
(`onClose`: abort by default)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import mcp_types as types
from mcp.shared.exceptions import MCPError

from undolog.api.gateway import GatewayConfig
from undolog.errors import UndoLogError
from undolog.gateway.agent_requests import AgentRequest
from undolog.gateway.bindings import SagaBinding, StepAt
from undolog.gateway.steps import NotCalled
from undolog.gateway.upstreams import Answer
from undolog.kube import Kube
from undolog.sdk import SagaRun, open_saga

Opening = Callable[[str | None, str], Awaitable[None]]  # who opens a saga, where: refused past its limit


async def no_limit(who: str | None, namespace: str) -> None:
    return None


@dataclass
class SessionSaga:
    """One session's saga, opened with its first step."""

    config: GatewayConfig
    kube: Kube
    namespace: str  # the caller's (decisions/tenancy.py)
    principal: str | None  # the caller's name, recorded on its sagas
    opening: Opening = no_limit
    run: SagaRun | None = None
    steps: int = 0  # names steps uniquely within the saga: <tool>-<n>
    last_seen: float = field(default_factory=time.monotonic)
    _opening: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def saga(self) -> SagaRun:
        async with self._opening:
            if self.run is None:
                await self.opening(self.principal, self.namespace)
                self.run = await open_saga(
                    generate_name="mcp-",
                    namespace=self.namespace,
                    org=self.config.org,
                    principal=self.principal,
                    deadline_seconds=self.config.deadline_seconds,
                    kube=self.kube,
                )
                self.steps = 0
            return self.run


class SessionBinding(SagaBinding):
    def __init__(self, session: SessionSaga) -> None:
        self.session = session

    async def named(self, tool: str) -> SagaRun | None:
        return self.session.run

    async def opened(self) -> SagaRun:
        return await self.session.saga()

    async def step(self, tool: str, call: StepAt) -> Answer:
        try:
            run = await self.session.saga()
        except (ValueError, UndoLogError) as error:
            raise NotCalled(f"tool {tool} was not called: {error}") from error
        self.session.steps += 1
        return await call(run, self.session.steps, {}, False)

    def meta(self, run: SagaRun) -> dict[str, str]:
        return {}

    def ended(self, run: SagaRun) -> None:
        self.session.run = None


class SessionSagas:
    """The sessions the gateway serves, by key (their Mcp-Session-Id, or the stdio connection)."""

    def __init__(self, config: GatewayConfig, kube: Kube, opening: Opening) -> None:
        self.config, self.kube, self.opening = config, kube, opening
        self.sessions: dict[str, SessionSaga] = {}

    def of(self, request: AgentRequest, tool: str, namespace: str) -> SessionSaga:
        """The request's session (its sagas in `namespace`, the caller's), opened on its first request."""
        key = request.session_key
        if key is None:
            raise MCPError(
                types.INVALID_REQUEST,
                f"tool {tool} needs a session to be undoable: connect with the initialize handshake (protocol "
                "2025-11-25 or earlier), whose Mcp-Session-Id ties this call's step to the session's saga",
            )
        session = self.sessions.get(key)
        if session is None:
            session = SessionSaga(self.config, self.kube, namespace, request.identity, self.opening)
            self.sessions[key] = session
        session.last_seen = time.monotonic()
        return session

    def idle(self) -> list[str]:
        """The sessions with no request for idleSeconds."""
        cutoff = time.monotonic() - self.config.idle_seconds
        return [key for key, session in self.sessions.items() if session.last_seen < cutoff]
