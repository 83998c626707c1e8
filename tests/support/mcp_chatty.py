"""A local MCP server (stdio) that logs while it works, for the gateway's routing of what a
server sends back: `make(name)` (undone by `unmake(name)`), and the read-only `work()`, which
logs once alone, then waits for an `unmake` to begin and logs again beside it; `unmake` logs,
then waits for that `work` to finish. So the operator's undo and an agent's call are in flight
on the one connection at once, each logging, by their own conditions rather than by time."""

from __future__ import annotations

import asyncio

import mcp_types as types
from mcp.server.mcpserver import Context, MCPServer

OVERLAP_SECONDS = 30.0  # how long each waits for the other before it gives up (and says so)


def chatty() -> MCPServer:
    server = MCPServer("chatty", log_level="WARNING")
    undo_began, work_done = asyncio.Event(), asyncio.Event()

    @server.tool()
    async def make(name: str) -> str:
        """Make a thing."""
        return f"made {name}"

    @server.tool()
    async def unmake(name: str, ctx: Context) -> str:
        """Unmake a thing, saying so."""
        undo_began.set()
        await ctx.info(f"unmake {name}: the operator's undo")
        try:
            await asyncio.wait_for(work_done.wait(), OVERLAP_SECONDS)
        except TimeoutError:
            return f"unmade {name} (no work beside it)"
        return f"unmade {name} beside the work"

    @server.tool(annotations=types.ToolAnnotations(read_only_hint=True))
    async def work(ctx: Context) -> str:
        """Work, saying so, until an undo has run beside it."""
        await ctx.info("work: alone")
        try:
            await asyncio.wait_for(undo_began.wait(), OVERLAP_SECONDS)
        except TimeoutError:
            return "worked (no undo beside it)"
        await ctx.info("work: beside the undo")
        work_done.set()
        return "worked beside the undo"

    return server


if __name__ == "__main__":
    chatty().run("stdio")
