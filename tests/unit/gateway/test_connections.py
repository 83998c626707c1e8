"""Where what an upstream sends back goes (gateway/connections.py): to the agent request it
belongs to, or nowhere when the gateway cannot tell whose it is."""

from __future__ import annotations

from typing import Any, cast

from mcp import Client
from mcp.server.session import ServerSession

from undolog.gateway.agent_requests import AgentRequest, OperatorRequest
from undolog.gateway.connections import Connection


async def _announced(*_: Any) -> None:
    return None


def connection(upstream: str, owner: str | None = None) -> Connection:
    """A connection whose client is never called here (what it routes is decided without it)."""
    opened = Connection(upstream, owner, _announced)
    opened.client = cast(Client, object())
    return opened


def request(session_key: str | None, request_id: int = 1) -> AgentRequest:
    return AgentRequest(cast(ServerSession, object()), request_id, session_key, None, stateless=session_key is None)


async def test_a_message_goes_to_the_latest_request_while_those_in_flight_are_one_agent_s() -> None:
    shared = connection("files")
    first, second = request("session-a", 1), request("session-a", 2)
    async with shared.serving(first), shared.serving(second):
        assert shared.target("a log message") is second


async def test_a_message_beside_another_agent_s_request_or_the_operator_s_goes_nowhere() -> None:
    shared = connection("files")
    mine = request("session-a")
    async with shared.serving(mine):
        async with shared.serving(request("session-b")):
            assert shared.target("a log message") is None
        async with shared.serving(OperatorRequest("files.restore")):
            assert shared.target("a log message") is None
        assert shared.target("a log message") is mine


async def test_two_stateless_requests_are_two_agents_and_the_operator_alone_is_nobody() -> None:
    shared = connection("files")
    async with shared.serving(request(None)), shared.serving(request(None)):
        assert shared.target("a log message") is None
    async with shared.serving(OperatorRequest("files.restore")):
        assert shared.target("elicitation/create") is None
    assert shared.target("a log message") is None  # nothing in flight on a shared connection


async def test_a_session_s_own_connection_speaks_to_its_session_between_requests() -> None:
    own = connection("tracker", "session-a")
    async with own.serving(request("session-a", 7)):
        pass
    target = own.target("a log message")
    assert target is not None
    assert (target.session_key, target.request_id) == ("session-a", None)
