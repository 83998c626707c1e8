"""A local MCP server (stdio) that answers initialize and never answers tools/list: an upstream
that connects and then hangs."""

from __future__ import annotations

from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server


async def never(_: Any, __: types.PaginatedRequestParams | None) -> types.ListToolsResult:
    await anyio.sleep_forever()
    raise AssertionError("sleep_forever returned")  # it does not: this only types the handler


async def main() -> None:
    server: Server[Any] = Server("mute-lister", on_list_tools=never)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
