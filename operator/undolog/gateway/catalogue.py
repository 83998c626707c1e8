"""The tools the upstream servers list, under the names agents see (the tool's own,
`<upstream>.<tool>` where two upstreams share one), and what of the configuration's mappings
those lists contradict.

A server may list other tools to a client of the stateless revision (2026-07-28) than to one of
the session era: each era's agents see the list the server gives a client of their era."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import mcp_types as types
from mcp import Client
from pydantic import BaseModel, ConfigDict, Field

from undolog.api.gateway import GatewayConfig
from undolog.decisions.advertised_undo import ListedTool
from undolog.decisions.undo_expressions import expressions_in, mistyped, unknown_fields

MAX_PAGES = 100  # of one server's list (tools, resources, prompts): not read on past it


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
    """Every upstream's tools as it last listed them to each era, under the names agents see."""

    def __init__(self) -> None:
        self.tools: dict[str, UpstreamTool] = {}  # as the session era's agents see them
        self.stateless_tools: dict[str, UpstreamTool] = {}
        self._listed: dict[tuple[str, bool], list[types.Tool]] = {}  # by upstream and era (stateless or not)

    def keep(self, listed: Mapping[tuple[str, bool], list[types.Tool]], upstreams: Iterable[str]) -> None:
        """The lists just read, by upstream and era; an upstream not among them keeps what it listed before."""
        self._listed.update(listed)
        names = list(upstreams)
        self.tools = _named({name: self._listed.get((name, False), []) for name in names})
        self.stateless_tools = _named({name: self._listed.get((name, True), []) for name in names})

    def of(self, stateless: bool) -> dict[str, UpstreamTool]:
        """The tools an agent of that era sees."""
        return self.stateless_tools if stateless else self.tools

    def qualified(self, name: str) -> UpstreamTool:
        """The tool the configuration names `<upstream>.<tool>`, as either era's list gives it;
        KeyError when no server lists it."""
        for found in (*self.tools.values(), *self.stateless_tools.values()):
            if found.qualified == name:
                return found
        raise KeyError(f"no upstream lists {name}")


def _named(listed: dict[str, list[types.Tool]]) -> dict[str, UpstreamTool]:
    """The upstreams' tools under the names agents see them by."""
    tools = [UpstreamTool(name, tool) for name, of_one in listed.items() for tool in of_one]
    counts: dict[str, int] = {}
    for found in tools:
        counts[found.tool.name] = counts.get(found.tool.name, 0) + 1
    return {(t.tool.name if counts[t.tool.name] == 1 else t.qualified): t for t in tools}


class Page(Protocol):
    @property
    def next_cursor(self) -> str | None: ...


P = TypeVar("P", bound=Page)


async def _pages(fetch: Callable[[str | None], Awaitable[P]]) -> list[P]:
    """Every page of a server's tools/list, its cursor followed (at most MAX_PAGES)."""
    pages: list[P] = []
    cursor: str | None = None
    for _ in range(MAX_PAGES):
        pages.append(page := await fetch(cursor))
        cursor = page.next_cursor
        if not cursor:
            return pages
    raise EndlessListing(f"tools/list named a next page after {MAX_PAGES} pages")


async def tools_of(client: Client) -> list[types.Tool]:
    """The server's tools, every page of them."""
    return [tool for page in await _pages(lambda cursor: client.list_tools(cursor=cursor)) for tool in page.tools]


async def raw_tools_of(client: Client) -> dict[str, ListedTool]:
    """The server's tools as it sent them, annotations' unknown fields kept (the SDK's types drop
    them): by name, every page of them."""

    async def page(cursor: str | None) -> RawListing:
        request = types.ListToolsRequest(params=types.PaginatedRequestParams(cursor=cursor))
        return await client.session.send_request(request, RawListing)

    tools = (
        ListedTool(
            name=str(raw.get("name")),
            annotations=raw.get("annotations") or {},
            input_schema=raw.get("inputSchema") or {},
            output_schema=raw.get("outputSchema"),
        )
        for listing in await _pages(page)
        for raw in listing.tools
    )
    return {tool.name: tool for tool in tools}


class EndlessListing(ValueError):
    """A server whose tools/list pages on past MAX_PAGES: not read further."""


def advertised(listed: Mapping[tuple[str, bool], dict[str, ListedTool]]) -> dict[str, dict[str, ListedTool]]:
    """Every upstream's tools as the server sent them to either era (the session era's where
    both list one): by upstream, by tool name."""
    merged: dict[str, dict[str, ListedTool]] = {}
    for stateless in (True, False):
        for (name, era), tools in listed.items():
            if era is stateless:
                merged.setdefault(name, {}).update(tools)
    return merged


def mapping_problems(config: GatewayConfig, catalogue: ToolCatalogue) -> list[str]:
    """What of the mappings the servers' own lists contradict: a mapped, before-image or guard
    tool no server lists, and an expression naming a field the tools' schemas do not declare (checked
    where a server gives the schema)."""
    listed = {t.qualified: t for t in (*catalogue.stateless_tools.values(), *catalogue.tools.values())}
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
