"""The tools the upstream servers list, under the names agents see (the tool's own,
`<upstream>.<tool>` where two upstreams share one), and what of the configuration's mappings
those lists contradict."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mcp_types as types
from mcp import Client
from pydantic import BaseModel, ConfigDict, Field

from undolog.api.gateway import GatewayConfig
from undolog.decisions.advertised_undo import ListedTool
from undolog.decisions.undo_expressions import expressions_in, mistyped, unknown_fields


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


class RawListing(BaseModel):
    """A tools/list page with each tool as the JSON the server sent."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    tools: list[dict[str, Any]]
    next_cursor: str | None = Field(default=None, alias="nextCursor")


class ToolCatalogue:
    """Every upstream's tools, listed again when one announces its list changed."""

    def __init__(self) -> None:
        self.tools: dict[str, UpstreamTool] = {}

    async def list_tools(self, clients: dict[str, Client]) -> None:
        listed: list[UpstreamTool] = []
        for name, client in clients.items():
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

    def qualified(self, name: str) -> UpstreamTool:
        """The tool the configuration names `<upstream>.<tool>`; KeyError when no server lists it."""
        for found in self.tools.values():
            if found.qualified == name:
                return found
        raise KeyError(f"no upstream lists {name}")


async def listed_tools(clients: dict[str, Client]) -> dict[str, dict[str, ListedTool]]:
    """Every upstream's tools as the server sent them, annotations' unknown fields kept (the
    SDK's types drop them): by upstream, by tool name."""
    listed: dict[str, dict[str, ListedTool]] = {}
    for name, client in clients.items():
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


def mapping_problems(config: GatewayConfig, catalogue: ToolCatalogue) -> list[str]:
    """What of the mappings the servers' own lists contradict: a mapped, before-image or guard
    tool no server lists, and an expression naming a field the tools' schemas do not declare (checked
    where a server gives the schema)."""
    listed = {t.qualified: t for t in catalogue.tools.values()}
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
        if rule.after is not None and rule.after.tool is not None and rule.after.tool not in listed:
            problems.append(f"tools.{name}.after: no upstream lists {rule.after.tool}")
            continue
        schemas = {"args": tool.tool.input_schema}
        if tool.tool.output_schema is not None:
            schemas["output"] = tool.tool.output_schema
        if before is not None and before.tool.output_schema is not None:
            schemas["before"] = before.tool.output_schema
        places = [(f"tools.{name}.compensation.args", rule.compensation.args if rule.compensation else {})]
        places += [(f"tools.{name}.before.args", rule.before.args)] if rule.before else []
        places += [(f"tools.{name}.after.args", rule.after.args)] if rule.after and rule.after.args else []
        for where, template in places:
            problems += [f"{where}: {why}" for s in expressions_in(template) if (why := unknown_fields(s, schemas))]
        undoing = listed.get(rule.compensation.tool) if rule.compensation and rule.compensation.tool else None
        if undoing is not None and rule.compensation is not None:
            refused = mistyped(rule.compensation.args, schemas, undoing.tool.input_schema)
            problems += [f"tools.{name}.compensation.args.{why}" for why in refused]
    return problems
