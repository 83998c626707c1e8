"""An MCP server of both eras whose one tool, `tagged`, mirrors its `region` argument into the
`Mcp-Param-Region` header (`x-mcp-header`, the stateless revision's standard headers): the
`mcp` package's server refuses a call of that revision without it (-32020). The tool answers
with the region it was called for.

    python -m tests.support.mcp_param_headers --port N
"""

from __future__ import annotations

import argparse
from typing import Any

import mcp_types as types
from mcp.server.lowlevel import Server

from tests.support.loopback_mcp import serve_on_loopback

TAGGED = types.Tool(
    name="tagged",
    description="Answers with the region it was called for",
    input_schema={
        "type": "object",
        "properties": {"region": {"type": "string", "x-mcp-header": "Region"}},
        "required": ["region"],
    },
)


async def list_tools(_: Any, __: types.PaginatedRequestParams | None) -> types.ListToolsResult:
    return types.ListToolsResult(tools=[TAGGED])


async def call_tool(_: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    region = (params.arguments or {}).get("region")
    return types.CallToolResult(content=[types.TextContent(type="text", text=f"called for {region}")])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    port = parser.parse_args().port
    serve_on_loopback(Server("param-headers", on_list_tools=list_tools, on_call_tool=call_tool), port)


if __name__ == "__main__":
    main()
