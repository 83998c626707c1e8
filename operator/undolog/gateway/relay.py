"""What the upstream servers offer besides tools, passed through as they answer it: resources
(listed, their templates, read, subscribed to), prompts (listed, got), completion and the
logging level. Lists are every upstream's, merged (each one's pages read through); a resource
or a prompt goes to the upstream that listed it (else to each in turn, until one answers). An
upstream that does not offer a feature answers nothing for it, and one that does not answer
within its callSeconds is asked to cancel and left out of a list. Each goes over the agent
session's own connection (connections.py), so what the server sends back reaches that session;
a stateless agent's, over a client of its own, so a server's question (`input_required`) comes
back to it as it came and its answers go on with its retry."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import mcp_types as types
from mcp import Client
from mcp.shared.exceptions import MCPError

from undolog.gateway.agent_requests import AgentRequest
from undolog.gateway.catalogue import MAX_PAGES
from undolog.gateway.subscriptions import Subscriptions
from undolog.gateway.upstreams import Rounds, Upstreams, asked, modern

T = TypeVar("T")


def _rounds(
    request: AgentRequest, params: types.ReadResourceRequestParams | types.GetPromptRequestParams
) -> Rounds | None:
    """A stateless agent's answers to a server's question, passed on (the server may ask again)."""
    return Rounds.of(params) if request.stateless else None


class Relay:
    def __init__(self, upstreams: Upstreams, subscriptions: Subscriptions) -> None:
        self.upstreams, self.subscriptions = upstreams, subscriptions
        self.resources: dict[str, str] = {}  # URI -> the upstream that listed it
        self.prompts: dict[str, str] = {}  # name -> the upstream that listed it

    def handlers(self) -> dict[str, Callable[[AgentRequest, Any], Awaitable[Any]]]:
        """The lowlevel Server's handlers, each given the request it serves (the Server
        advertises the capabilities they give)."""
        return {
            "on_list_resources": self.list_resources,
            "on_list_resource_templates": self.list_resource_templates,
            "on_read_resource": self.read_resource,
            "on_list_prompts": self.list_prompts,
            "on_get_prompt": self.get_prompt,
            "on_subscribe_resource": self.subscribe,
            "on_unsubscribe_resource": self.unsubscribe,
            "on_completion": self.complete,
            "on_set_logging_level": self.set_logging_level,
        }

    async def _pages(
        self, request: AgentRequest, fetch: Callable[[str | None, Client], Awaitable[Any]], field: str
    ) -> list[tuple[str, Any]]:
        found: list[tuple[str, Any]] = []
        what = f"its list of {field.replace('_', ' ')}"
        for name in self.upstreams.config:
            cursor: str | None = None
            for _ in range(MAX_PAGES):
                try:
                    page = await asked(self.upstreams, request, name, functools.partial(fetch, cursor), what)
                except MCPError:  # it does not offer them, or did not answer in time: the others' are listed
                    break
                found += [(name, item) for item in getattr(page, field)]
                cursor = page.next_cursor
                if not cursor:
                    break
        return found

    async def list_resources(
        self, request: AgentRequest, params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        found = await self._pages(
            request, lambda cursor, c: c.list_resources(cursor=cursor, cache_mode="bypass"), "resources"
        )
        self.resources.update({str(r.uri): name for name, r in found})
        return types.ListResourcesResult(resources=[r for _, r in found])

    async def list_resource_templates(
        self, request: AgentRequest, params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        found = await self._pages(
            request,
            lambda cursor, c: c.list_resource_templates(cursor=cursor, cache_mode="bypass"),
            "resource_templates",
        )
        return types.ListResourceTemplatesResult(resource_templates=[t for _, t in found])

    async def read_resource(
        self, request: AgentRequest, params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult | types.InputRequiredResult:
        uri, rounds = str(params.uri), _rounds(request, params)

        async def read(c: Client) -> types.ReadResourceResult | types.InputRequiredResult:
            if rounds is None or not modern(c):
                return await c.read_resource(uri, cache_mode="bypass")
            return await c.session.read_resource(
                uri, input_responses=rounds.responses, request_state=rounds.state, allow_input_required=True
            )

        return await self._first(request, self.resources.get(uri), read, uri)

    async def list_prompts(
        self, request: AgentRequest, params: types.PaginatedRequestParams | None
    ) -> types.ListPromptsResult:
        found = await self._pages(
            request, lambda cursor, c: c.list_prompts(cursor=cursor, cache_mode="bypass"), "prompts"
        )
        self.prompts.update({p.name: name for name, p in found})
        return types.ListPromptsResult(prompts=[p for _, p in found])

    async def get_prompt(
        self, request: AgentRequest, params: types.GetPromptRequestParams
    ) -> types.GetPromptResult | types.InputRequiredResult:
        name, arguments, rounds = params.name, params.arguments, _rounds(request, params)

        async def get(c: Client) -> types.GetPromptResult | types.InputRequiredResult:
            if rounds is None or not modern(c):
                return await c.get_prompt(name, arguments)
            return await c.session.get_prompt(
                name, arguments, input_responses=rounds.responses, request_state=rounds.state, allow_input_required=True
            )

        return await self._first(request, self.prompts.get(name), get, name)

    async def complete(self, request: AgentRequest, params: types.CompleteRequestParams) -> types.CompleteResult:
        ref = params.ref
        owner = self.prompts.get(ref.name) if isinstance(ref, types.PromptReference) else None
        argument = {"name": params.argument.name, "value": params.argument.value}
        context = params.context.arguments if params.context else None
        return await self._first(request, owner, lambda c: c.complete(ref, argument, context), "completion")

    async def subscribe(self, request: AgentRequest, params: types.SubscribeRequestParams) -> types.EmptyResult:
        uri = str(params.uri)
        await self._first(request, self.resources.get(uri), lambda c: c.subscribe_resource(uri), uri)
        self.subscriptions.subscribed(request, uri, True)
        return types.EmptyResult()

    async def unsubscribe(self, request: AgentRequest, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
        uri = str(params.uri)
        self.subscriptions.subscribed(request, uri, False)
        await self._first(request, self.resources.get(uri), lambda c: c.unsubscribe_resource(uri), uri)
        return types.EmptyResult()

    async def set_logging_level(self, request: AgentRequest, params: types.SetLevelRequestParams) -> types.EmptyResult:
        for name in self.upstreams.config:
            with contextlib.suppress(MCPError):  # it does not log, or did not answer in time
                await asked(self.upstreams, request, name, lambda c: c.set_logging_level(params.level), "its log level")
        return types.EmptyResult()

    async def _first(
        self, request: AgentRequest, owner: str | None, ask: Callable[[Client], Awaitable[T]], what: str
    ) -> T:
        """The owner's answer, else the first upstream's that answers; the last refusal when none does."""
        names = [owner] if owner is not None else list(self.upstreams.config)
        refused: MCPError | None = None
        for name in names:
            try:
                return await asked(self.upstreams, request, name, ask, what)
            except MCPError as error:
                refused = error
        raise refused or MCPError(types.INVALID_PARAMS, f"no upstream offers {what}")
