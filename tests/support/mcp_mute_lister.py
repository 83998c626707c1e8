"""A local MCP server (stdio) that answers initialize and never answers tools/list: an upstream
that connects and then hangs. With `--after-change`, it lists its one tool, `go_quiet`, until
that is called: the call announces the list changed, and tools/list is never answered again.
With `--endless`, every page of its tools/list names a next one. With `--mute-resources`, it
lists its tool and never answers resources/list; with `--mute-subscribe`, never
resources/subscribe or unsubscribe."""

from __future__ import annotations

import argparse
from typing import Any

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

GO_QUIET = types.Tool(
    name="go_quiet", description="Announces a change, then lists nothing", input_schema={"type": "object"}
)


class Lister:
    def __init__(self, quiet: bool, endless: bool) -> None:
        self.quiet, self.endless = quiet, endless

    async def list_tools(self, _: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        if self.quiet:
            await anyio.sleep_forever()
        page = int(params.cursor or 0) if params else 0
        return types.ListToolsResult(tools=[GO_QUIET], next_cursor=str(page + 1) if self.endless else None)

    async def call_tool(self, ctx: ServerRequestContext[Any], _: types.CallToolRequestParams) -> types.CallToolResult:
        self.quiet = True
        await ctx.session.send_tool_list_changed()
        return types.CallToolResult(content=[types.TextContent(type="text", text="quiet from now on")])


async def never(_: Any, __: types.PaginatedRequestParams | None) -> types.ListResourcesResult:
    await anyio.sleep_forever()
    raise AssertionError("sleep_forever returned")  # it does not: this only types the handler


async def never_subscribed(
    _: Any, __: types.SubscribeRequestParams | types.UnsubscribeRequestParams
) -> types.EmptyResult:
    await anyio.sleep_forever()
    raise AssertionError("sleep_forever returned")


async def main(after_change: bool, endless: bool, mute_resources: bool, mute_subscribe: bool) -> None:
    lister = Lister(quiet=not (after_change or endless or mute_resources or mute_subscribe), endless=endless)
    server: Server[Any] = Server(
        "mute-lister",
        on_list_tools=lister.list_tools,
        on_call_tool=lister.call_tool,
        on_list_resources=never if mute_resources else None,
        on_subscribe_resource=never_subscribed if mute_subscribe else None,
        on_unsubscribe_resource=never_subscribed if mute_subscribe else None,
    )
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--after-change", action="store_true")
    parser.add_argument("--endless", action="store_true")
    parser.add_argument("--mute-resources", action="store_true")
    parser.add_argument("--mute-subscribe", action="store_true")
    options = parser.parse_args()
    anyio.run(main, options.after_change, options.endless, options.mute_resources, options.mute_subscribe)
