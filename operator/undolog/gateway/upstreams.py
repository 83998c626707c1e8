"""The MCP servers behind the gateway: one client each (the `mcp` package's), their tools, and
the calls forwarded to them with the step's Idempotency-Key (in `_meta`, and as the HTTP header
on streamable HTTP)."""

from __future__ import annotations

import json
import os
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from pydantic import BaseModel, ConfigDict, Field

from undolog.api.gateway import GatewayConfig, Upstream
from undolog.calls.mcp import KEY_META, keyed_meta
from undolog.decisions.advertised_undo import ListedTool
from undolog.decisions.undo_expressions import expressions_in, unknown_fields

IDEMPOTENCY_HEADER = "Idempotency-Key"


@dataclass(frozen=True)
class UpstreamTool:
    upstream: str
    tool: types.Tool

    @property
    def qualified(self) -> str:
        """<upstream>.<tool>: how the configuration names it."""
        return f"{self.upstream}.{self.tool.name}"

    @property
    def read_only_hint(self) -> bool:
        return bool(self.tool.annotations and self.tool.annotations.read_only_hint)

    @property
    def destructive_hint(self) -> bool:
        return bool(self.tool.annotations and self.tool.annotations.destructive_hint)


async def keyed(request: httpx2.Request) -> None:
    """The HTTP header of a tools/call, from its `_meta` (the MCP client writes the body)."""
    try:
        message = json.loads(request.content or b"null")
    except ValueError:
        return
    params = message.get("params") if isinstance(message, dict) else None
    meta = params.get("_meta") if isinstance(params, dict) else None
    if isinstance(meta, dict) and isinstance(key := meta.get(KEY_META), str):
        request.headers[IDEMPOTENCY_HEADER] = key


class RawListing(BaseModel):
    """A tools/list page with each tool as the JSON the server sent."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    tools: list[dict[str, Any]]
    next_cursor: str | None = Field(default=None, alias="nextCursor")


class Upstreams:
    """Connected at start, closed at the end; `tools` lists every upstream's tools under the name
    the agent sees (the tool's own, `<upstream>.<tool>` where two upstreams share one)."""

    def __init__(self, upstreams: dict[str, Upstream]) -> None:
        self.config = upstreams
        self.clients: dict[str, Client] = {}
        self.tools: dict[str, UpstreamTool] = {}
        self._stack = AsyncExitStack()

    async def __aenter__(self) -> Upstreams:
        try:
            for name, upstream in self.config.items():
                self.clients[name] = await self._stack.enter_async_context(self._client(upstream))
            await self.list_tools()
        except BaseException:
            await self._stack.aclose()
            raise
        return self

    async def __aexit__(self, *_: object) -> None:
        await self._stack.aclose()

    def _client(self, upstream: Upstream) -> Client:
        if upstream.url is not None:
            http = httpx2.AsyncClient(event_hooks={"request": [keyed]}, trust_env=False, timeout=None)
            self._stack.push_async_callback(http.aclose)
            return Client(streamable_http_client(upstream.url, http_client=http), mode="legacy", cache=None)
        assert upstream.command is not None
        command, *args = upstream.command
        parameters = StdioServerParameters(command=command, args=args, env={**os.environ, **upstream.env})
        return Client(stdio_client(parameters), mode="legacy", cache=None)

    async def list_tools(self) -> None:
        listed: list[UpstreamTool] = []
        for name, client in self.clients.items():
            cursor: str | None = None
            while True:
                page = await client.list_tools(cursor=cursor)
                listed.extend(UpstreamTool(name, tool) for tool in page.tools)
                cursor = page.next_cursor
                if not cursor:
                    break
        counts: dict[str, int] = {}
        for found in listed:
            counts[found.tool.name] = counts.get(found.tool.name, 0) + 1
        self.tools = {(t.tool.name if counts[t.tool.name] == 1 else t.qualified): t for t in listed}

    async def listed(self) -> dict[str, dict[str, ListedTool]]:
        """Every upstream's tools as the server sent them, annotations' unknown fields kept (the
        SDK's types drop them): by upstream, by tool name."""
        listed: dict[str, dict[str, ListedTool]] = {}
        for name, client in self.clients.items():
            tools: dict[str, ListedTool] = listed.setdefault(name, {})
            cursor: str | None = None
            while True:
                request = types.ListToolsRequest(params=types.PaginatedRequestParams(cursor=cursor))
                page = await client.session.send_request(request, RawListing)
                for raw in page.tools:
                    tool = ListedTool(
                        name=str(raw.get("name")),
                        annotations=raw.get("annotations") or {},
                        input_schema=raw.get("inputSchema") or {},
                        output_schema=raw.get("outputSchema"),
                    )
                    tools[tool.name] = tool
                cursor = page.next_cursor
                if not cursor:
                    break
        return listed

    def qualified(self, name: str) -> UpstreamTool:
        """The tool the configuration names `<upstream>.<tool>`; KeyError when no server lists it."""
        for found in self.tools.values():
            if found.qualified == name:
                return found
        raise KeyError(f"no upstream lists {name}")

    async def call(self, tool: UpstreamTool, arguments: dict[str, object], key: str | None) -> types.CallToolResult:
        meta = keyed_meta(key) if key else None
        return await self.clients[tool.upstream].call_tool(tool.tool.name, arguments, meta=meta)


def mapping_problems(config: GatewayConfig, upstreams: Upstreams) -> list[str]:
    """What of the mappings the servers' own lists contradict: a mapped or before-image tool no
    server lists, and an expression naming a field the tools' schemas do not declare (checked
    where a server gives the schema)."""
    listed = {t.qualified: t for t in upstreams.tools.values()}
    problems = []
    for name, rule in config.tools.items():
        tool = listed.get(name)
        before = listed.get(rule.before.tool) if rule.before else None
        if tool is None:
            problems.append(f"tools.{name}: no upstream lists {name}")
            continue
        if rule.before is not None and before is None:
            problems.append(f"tools.{name}.before: no upstream lists {rule.before.tool}")
            continue
        schemas = {"args": tool.tool.input_schema}
        if tool.tool.output_schema is not None:
            schemas["output"] = tool.tool.output_schema
        if before is not None and before.tool.output_schema is not None:
            schemas["before"] = before.tool.output_schema
        places = [(f"tools.{name}.compensation.args", rule.compensation.args if rule.compensation else {})]
        places += [(f"tools.{name}.before.args", rule.before.args)] if rule.before else []
        for where, template in places:
            problems += [f"{where}: {why}" for s in expressions_in(template) if (why := unknown_fields(s, schemas))]
    return problems
