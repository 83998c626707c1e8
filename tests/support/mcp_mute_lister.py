"""A local MCP server that answers initialize and never answers tools/list: an upstream
that connects and then hangs. With `--after-change`, it lists its one tool, `go_quiet`, until
that is called: the call announces the list changed (on HTTP, to the listen streams of the
stateless revision, which only this mode takes), and tools/list is never answered again.
With `--endless`, every page of its tools/list names a next one. With `--mute-resources`, it
lists its tool and never answers resources/list; with `--mute-subscribe`, never
resources/subscribe or unsubscribe. On stdio, or with `--port N` on streamable HTTP on loopback
(/mcp, and /healthz once it serves)."""

from __future__ import annotations

import argparse
from typing import Any

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler
from mcp.shared.subscriptions import ToolsListChanged

GO_QUIET = types.Tool(
    name="go_quiet", description="Announces a change, then lists nothing", input_schema={"type": "object"}
)


class Lister:
    def __init__(self, quiet: bool, endless: bool, on_stdio: bool) -> None:
        self.quiet, self.endless, self.on_stdio = quiet, endless, on_stdio
        self.bus = InMemorySubscriptionBus()  # the change, to subscriptions/listen (2026-07-28)

    async def list_tools(self, _: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        if self.quiet:
            await anyio.sleep_forever()
        page = int(params.cursor or 0) if params else 0
        return types.ListToolsResult(tools=[GO_QUIET], next_cursor=str(page + 1) if self.endless else None)

    async def call_tool(self, ctx: ServerRequestContext[Any], _: types.CallToolRequestParams) -> types.CallToolResult:
        self.quiet = True
        if self.on_stdio:
            await ctx.session.send_tool_list_changed()
        else:  # the gateway hears an upstream of both eras on its listen stream, whoever called
            await self.bus.publish(ToolsListChanged())
        return types.CallToolResult(content=[types.TextContent(type="text", text="quiet from now on")])


async def never(_: Any, __: types.PaginatedRequestParams | None) -> types.ListResourcesResult:
    await anyio.sleep_forever()
    raise AssertionError("sleep_forever returned")  # it does not: this only types the handler


async def never_subscribed(
    _: Any, __: types.SubscribeRequestParams | types.UnsubscribeRequestParams
) -> types.EmptyResult:
    await anyio.sleep_forever()
    raise AssertionError("sleep_forever returned")


def mute_lister(options: argparse.Namespace) -> Server[Any]:
    muted = options.after_change or options.endless or options.mute_resources or options.mute_subscribe
    lister = Lister(quiet=not muted, endless=options.endless, on_stdio=not options.port)
    return Server(
        "mute-lister",
        on_list_tools=lister.list_tools,
        on_call_tool=lister.call_tool,
        on_list_resources=never if options.mute_resources else None,
        on_subscribe_resource=never_subscribed if options.mute_subscribe else None,
        on_unsubscribe_resource=never_subscribed if options.mute_subscribe else None,
        on_subscriptions_listen=ListenHandler(lister.bus) if options.after_change else None,
    )


async def on_stdio(server: Server[Any]) -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--after-change", action="store_true")
    parser.add_argument("--endless", action="store_true")
    parser.add_argument("--mute-resources", action="store_true")
    parser.add_argument("--mute-subscribe", action="store_true")
    parser.add_argument("--port", type=int, help="serve streamable HTTP on this loopback port, not stdio")
    options = parser.parse_args()
    if options.port:
        # Imported here: on stdio its start is timed by the gateway's connectSeconds, and needs none of it.
        from tests.support.loopback_mcp import serve_on_loopback

        serve_on_loopback(mute_lister(options), options.port)
    else:
        anyio.run(on_stdio, mute_lister(options))
