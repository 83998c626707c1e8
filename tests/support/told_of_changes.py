"""An upstream's tool list changing, as agents of both eras see it through the gateway."""

from __future__ import annotations

import asyncio

import anyio
import mcp_types as types
from mcp import Client
from mcp.shared.subscriptions import ToolsListChanged

from tests.support.waiting import eventually


async def both_eras_told(url: str, trigger: str, added: str) -> None:
    """A stateless agent calls `trigger`, which adds the tool `added` upstream: it hears so on its
    listen stream, a session-era agent on its session, and both list the new tool and call it."""
    told: list[object] = []

    async def heard(message: object) -> None:
        told.append(message)

    async with Client(url, mode="legacy", message_handler=heard) as session_agent, Client(url) as agent:
        await session_agent.list_tools()  # the gateway knows the session from its first request
        async with agent.listen(tools_list_changed=True) as changes:
            called = await agent.call_tool(trigger, {})
            assert not called.is_error, called
            with anyio.fail_after(10):
                change = await anext(aiter(changes))
        assert isinstance(change, ToolsListChanged)
        await eventually(
            lambda: asyncio.sleep(0, told),
            lambda seen: any(isinstance(m, types.ToolListChangedNotification) for m in seen),
            10,
            "the session told of the change",
        )
        for client in (session_agent, agent):
            assert added in [t.name for t in (await client.list_tools()).tools]
            assert not (await client.call_tool(added, {})).is_error
