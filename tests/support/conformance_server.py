"""An MCP server written to the conformance suite's server specification
(@modelcontextprotocol/conformance 0.1.16: each server scenario's "Server Implementation
Requirements"; 0.2.0-alpha.12 for the stateless revision's, conformance_rounds.py), with the
`mcp` package's low-level server over streamable HTTP. The suite run against it directly is the
baseline the gateway in front of it is held to.

    python -m tests.support.conformance_server --port N
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import itertools
import json
import struct
import wave
import zlib
from collections import OrderedDict
from typing import Any, cast

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.request_state import RequestStateBoundary, RequestStateSecurity
from mcp.server.streamable_http import EventCallback, EventId, EventMessage, EventStore, StreamId
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import PromptsListChanged, ResourceUpdated, ToolsListChanged
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from tests.support import conformance_rounds, conformance_tasks
from tests.support.loopback_mcp import serve_on_loopback

Ctx = ServerRequestContext[Any]


def png() -> str:
    """A 1x1 red PNG, base64."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    raw = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\x00\xff\x00\x00"))
    return base64.b64encode(raw + chunk(b"IEND", b"")).decode()


def wav() -> str:
    """A tenth of a second of silence, base64."""
    out = io.BytesIO()
    with wave.open(out, "wb") as sound:
        sound.setnchannels(1)
        sound.setsampwidth(2)
        sound.setframerate(8000)
        sound.writeframes(b"\x00\x00" * 800)
    return base64.b64encode(out.getvalue()).decode()


IMAGE, AUDIO = png(), wav()


def text(said: str) -> types.TextContent:
    return types.TextContent(type="text", text=said)


def tool(name: str, description: str, **properties: str) -> types.Tool:
    schema = {"type": "object", "properties": {k: {"type": "string", "description": v} for k, v in properties.items()}}
    return types.Tool(name=name, description=description, input_schema=schema | {"required": list(properties)})


TOOLS = [
    tool("test_simple_text", "Returns simple text"),
    tool("test_image_content", "Returns an image"),
    tool("test_audio_content", "Returns audio"),
    tool("test_embedded_resource", "Returns an embedded resource"),
    tool("test_multiple_content_types", "Returns text, an image and a resource"),
    tool("test_tool_with_logging", "Sends three log messages while it runs"),
    tool("test_tool_with_progress", "Reports progress while it runs"),
    tool("test_error_handling", "Always fails"),
    tool("test_sampling", "Asks the client's LLM", prompt="The prompt to send to the LLM"),
    tool("test_elicitation", "Asks the user", message="The message to show the user"),
    tool("test_elicitation_sep1034_defaults", "Asks the user, with defaults of every primitive type"),
    tool("test_elicitation_sep1330_enums", "Asks the user, with every kind of enum"),
    tool("test_reconnection", "Closes its SSE stream mid-call, then answers (SEP-1699)"),
    types.Tool(
        name="json_schema_2020_12_tool",
        description="Tool with JSON Schema 2020-12 features",
        input_schema={
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "$defs": {
                "address": {"type": "object", "properties": {"street": {"type": "string"}, "city": {"type": "string"}}}
            },
            "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/address"}},
            "additionalProperties": False,
        },
    ),
]

DEFAULTS_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "default": "John Doe"},
        "age": {"type": "integer", "default": 30},
        "score": {"type": "number", "default": 95.5},
        "status": {"type": "string", "enum": ["active", "inactive", "pending"], "default": "active"},
        "verified": {"type": "boolean", "default": True},
    },
}
OPTIONS = ["option1", "option2", "option3"]
ENUMS_SCHEMA = {
    "type": "object",
    "properties": {
        "untitledSingle": {"type": "string", "enum": OPTIONS},
        "titledSingle": {
            "type": "string",
            "oneOf": [
                {"const": f"value{n}", "title": f"{t} Option"} for n, t in ((1, "First"), (2, "Second"), (3, "Third"))
            ],
        },
        "legacyEnum": {
            "type": "string",
            "enum": ["opt1", "opt2", "opt3"],
            "enumNames": ["Option One", "Option Two", "Option Three"],
        },
        "untitledMulti": {"type": "array", "items": {"type": "string", "enum": OPTIONS}},
        "titledMulti": {
            "type": "array",
            "items": {
                "anyOf": [
                    {"const": f"value{n}", "title": f"{t} Choice"}
                    for n, t in ((1, "First"), (2, "Second"), (3, "Third"))
                ]
            },
        },
    },
}


class MemoryEvents(EventStore):
    """The SSE events of the last streams, for a client that reconnects with Last-Event-ID."""

    def __init__(self, keep: int = 1000) -> None:
        self.events: OrderedDict[str, tuple[StreamId, types.JSONRPCMessage | None]] = OrderedDict()
        self.keep, self.ids = keep, itertools.count(1)

    async def store_event(self, stream_id: StreamId, message: types.JSONRPCMessage | None) -> EventId:
        event = str(next(self.ids))
        self.events[event] = (stream_id, message)
        while len(self.events) > self.keep:
            self.events.popitem(last=False)
        return event

    async def replay_events_after(self, last_event_id: EventId, send_callback: EventCallback) -> StreamId | None:
        if last_event_id not in self.events:
            return None
        stream = self.events[last_event_id][0]
        after = False
        for event, (on, message) in list(self.events.items()):
            if after and on == stream and message is not None:
                await send_callback(EventMessage(message, event))
            after = after or event == last_event_id
        return stream


WATCHED = "test://watched-resource"
TRIGGERS = [
    tool("test_trigger_tool_change", "Adds a tool to the list (its listeners are told)"),
    tool("test_trigger_prompt_change", "Adds a prompt to the list (its listeners are told)"),
    tool("test_trigger_resource_update", "Updates test://watched-resource (its listeners are told)"),
]


class Conformance:
    def __init__(self, mute_listen: bool = False) -> None:
        self.subscribed: set[str] = set()
        self.added_tools: list[types.Tool] = []
        self.added_prompts: list[types.Prompt] = []
        self.watched = 0  # how many times test://watched-resource was updated
        self.bus = InMemorySubscriptionBus()  # list changes, to subscriptions/listen (2026-07-28)
        self.server: Server[Any] = Server(
            "undolog-conformance-upstream",
            on_list_tools=self.list_tools,
            on_call_tool=self.call_tool,
            on_list_resources=self.list_resources,
            on_list_resource_templates=self.list_templates,
            on_read_resource=self.read_resource,
            on_subscribe_resource=self.subscribe,
            on_unsubscribe_resource=self.unsubscribe,
            on_list_prompts=self.list_prompts,
            on_get_prompt=self.get_prompt,
            on_completion=self.complete,
            on_set_logging_level=self.set_level,
            on_subscriptions_listen=never_acknowledged if mute_listen else ListenHandler(self.bus),
        )
        self.tasks = conformance_tasks.Tasks()
        self.tasks.install(self.server)
        # The requestState of an input_required round sealed, so a tampered one is refused.
        self.server.middleware.append(
            RequestStateBoundary(RequestStateSecurity.ephemeral(), default_audience="undolog-conformance-upstream")
        )

    async def list_tools(self, ctx: Ctx, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        """The input_required rounds' tools listed only to clients of the stateless revision, as
        the suite's reference server does: a gateway must list to each era what the server does."""
        modern = ctx.protocol_version in MODERN_PROTOCOL_VERSIONS
        rounds = [*conformance_rounds.TOOLS, *conformance_tasks.TOOLS] if modern else []
        return types.ListToolsResult(tools=[*TOOLS, *rounds, *TRIGGERS, *self.added_tools])

    async def call_tool(
        self, ctx: Ctx, params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        name, args = params.name, dict(params.arguments or {})
        if any(name == t.name for t in conformance_rounds.TOOLS):
            return await conformance_rounds.call(ctx, params)
        if name in conformance_tasks.NAMES:  # a task's answer is a dict the SDK's types do not name
            return cast(types.CallToolResult, await self.tasks.call(ctx, params))
        if name in {t.name for t in TRIGGERS}:
            return await self._trigger(ctx, name)
        if any(name == t.name for t in self.added_tools):
            return types.CallToolResult(content=[text(f"{name} was added")])
        simple = {
            "test_simple_text": [text("This is a simple text response for testing.")],
            "test_image_content": [types.ImageContent(type="image", data=IMAGE, mime_type="image/png")],
            "test_audio_content": [types.AudioContent(type="audio", data=AUDIO, mime_type="audio/wav")],
            "test_embedded_resource": [resource("test://embedded-resource", "This is an embedded resource content.")],
            "test_multiple_content_types": [
                text("Multiple content types test:"),
                types.ImageContent(type="image", data=IMAGE, mime_type="image/png"),
                resource(
                    "test://mixed-content-resource", json.dumps({"test": "data", "value": 123}), "application/json"
                ),
            ],
        }
        if name in simple:
            return types.CallToolResult(content=simple[name])
        if name == "test_error_handling":
            return types.CallToolResult(
                content=[text("This tool intentionally returns an error for testing")], is_error=True
            )
        if name == "json_schema_2020_12_tool":
            return types.CallToolResult(content=[text(f"Received: {json.dumps(args)}")])
        return types.CallToolResult(content=[text(await self._interactive(ctx, name, args))])

    async def _trigger(self, ctx: Ctx, name: str) -> types.CallToolResult:
        """A tool or a prompt added: its listeners told (and the calling session, on sessions)."""
        if name == "test_trigger_tool_change":
            self.added_tools.append(tool(f"test_added_tool_{len(self.added_tools) + 1}", "Added by a trigger"))
            await self.bus.publish(ToolsListChanged())
        elif name == "test_trigger_resource_update":
            self.watched += 1
            await self.bus.publish(ResourceUpdated(WATCHED))
            if WATCHED in self.subscribed:
                await ctx.session.send_resource_updated(WATCHED)
        else:
            number = len(self.added_prompts) + 1
            self.added_prompts.append(types.Prompt(name=f"test_added_prompt_{number}", description="Added"))
            await self.bus.publish(PromptsListChanged())
        return types.CallToolResult(content=[text(f"{name}: done")])

    async def _interactive(self, ctx: Ctx, name: str, args: dict[str, Any]) -> str:
        session, related = ctx.session, ctx.request_id
        if name == "test_tool_with_logging":
            for said in ("Tool execution started", "Tool processing data", "Tool execution completed"):
                await session.send_log_message("info", said, related_request_id=related)
                await asyncio.sleep(0.05)
            return "Tool with logging executed successfully"
        if name == "test_tool_with_progress":
            token = (ctx.meta or {}).get("progress_token")
            for progress in (0, 50, 100):
                if isinstance(token, str | int):
                    await session.send_progress_notification(token, progress, 100, related_request_id=str(related))
                await asyncio.sleep(0.05)
            return "Tool with progress executed successfully"
        if name == "test_sampling":
            message = types.SamplingMessage(role="user", content=text(str(args.get("prompt", ""))))
            answer = await session.create_message([message], max_tokens=100, related_request_id=related)
            content = answer.content
            return f"LLM response: {content.text if isinstance(content, types.TextContent) else content}"
        if name == "test_reconnection":
            if ctx.close_sse_stream is not None:
                await ctx.close_sse_stream()
            await asyncio.sleep(0.2)
            return "Reconnection test completed"
        schema = {
            "test_elicitation": {
                "type": "object",
                "properties": {
                    "username": {"type": "string", "description": "User's response"},
                    "email": {"type": "string", "description": "User's email address"},
                },
                "required": ["username", "email"],
            },
            "test_elicitation_sep1034_defaults": DEFAULTS_SCHEMA,
            "test_elicitation_sep1330_enums": ENUMS_SCHEMA,
        }.get(name)
        if schema is None:
            raise MCPError(types.INVALID_PARAMS, f"unknown tool {name}")
        asked = str(args.get("message") or "Please answer")
        answered = await session.elicit_form(asked, schema, related_request_id=related)
        prefix = "User response" if name == "test_elicitation" else "Elicitation completed"
        return f"{prefix}: action={answered.action}, content={json.dumps(answered.content)}"

    async def list_resources(self, ctx: Ctx, params: types.PaginatedRequestParams | None) -> types.ListResourcesResult:
        listed = [
            ("test://static-text", "static-text", "A static text resource", "text/plain"),
            ("test://static-binary", "static-binary", "A static binary resource (PNG)", "image/png"),
            ("test://watched-resource", "watched-resource", "A resource to subscribe to", "text/plain"),
        ]
        return types.ListResourcesResult(
            resources=[types.Resource(uri=u, name=n, description=d, mime_type=m) for u, n, d, m in listed]
        )

    async def list_templates(
        self, ctx: Ctx, params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        template = types.ResourceTemplate(
            uri_template="test://template/{id}/data",
            name="template",
            description="Data by id",
            mime_type="application/json",
        )
        return types.ListResourceTemplatesResult(resource_templates=[template])

    async def read_resource(self, ctx: Ctx, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        uri = str(params.uri)
        if uri == "test://static-text":
            contents: Any = types.TextResourceContents(
                uri=uri, mime_type="text/plain", text="This is the content of the static text resource."
            )
        elif uri == "test://static-binary":
            contents = types.BlobResourceContents(uri=uri, mime_type="image/png", blob=IMAGE)
        elif uri == "test://watched-resource":
            said = f"watched, updated {self.watched} times"
            contents = types.TextResourceContents(uri=uri, mime_type="text/plain", text=said)
        elif uri.startswith("test://template/") and uri.endswith("/data"):
            id_ = uri.removeprefix("test://template/").removesuffix("/data")
            said = json.dumps({"id": id_, "templateTest": True, "data": f"Data for ID: {id_}"})
            contents = types.TextResourceContents(uri=uri, mime_type="application/json", text=said)
        else:
            raise MCPError(types.INVALID_PARAMS, f"no resource {uri}")
        return types.ReadResourceResult(contents=[contents])

    async def subscribe(self, ctx: Ctx, params: types.SubscribeRequestParams) -> types.EmptyResult:
        self.subscribed.add(str(params.uri))
        return types.EmptyResult()

    async def unsubscribe(self, ctx: Ctx, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
        self.subscribed.discard(str(params.uri))
        return types.EmptyResult()

    async def list_prompts(self, ctx: Ctx, params: types.PaginatedRequestParams | None) -> types.ListPromptsResult:
        def argument(name: str, said: str) -> types.PromptArgument:
            return types.PromptArgument(name=name, description=said, required=True)

        return types.ListPromptsResult(
            prompts=[
                types.Prompt(name="test_simple_prompt", description="A simple prompt"),
                types.Prompt(
                    name="test_prompt_with_arguments",
                    description="A prompt with arguments",
                    arguments=[argument("arg1", "First test argument"), argument("arg2", "Second test argument")],
                ),
                types.Prompt(
                    name="test_prompt_with_embedded_resource",
                    description="A prompt with an embedded resource",
                    arguments=[argument("resourceUri", "URI of the resource to embed")],
                ),
                types.Prompt(name="test_prompt_with_image", description="A prompt with an image"),
                conformance_rounds.PROMPT,
                *self.added_prompts,
            ]
        )

    async def get_prompt(
        self, ctx: Ctx, params: types.GetPromptRequestParams
    ) -> types.GetPromptResult | types.InputRequiredResult:
        if params.name == conformance_rounds.PROMPT.name:
            return await conformance_rounds.prompt(params)
        args = params.arguments or {}

        def user(content: Any) -> types.PromptMessage:
            return types.PromptMessage(role="user", content=content)

        messages = {
            "test_simple_prompt": [user(text("This is a simple prompt for testing."))],
            "test_prompt_with_arguments": [
                user(text(f"Prompt with arguments: arg1='{args.get('arg1')}', arg2='{args.get('arg2')}'"))
            ],
            "test_prompt_with_embedded_resource": [
                user(
                    resource(str(args.get("resourceUri", "test://example")), "Embedded resource content for testing.")
                ),
                user(text("Please process the embedded resource above.")),
            ],
            "test_prompt_with_image": [
                user(types.ImageContent(type="image", data=IMAGE, mime_type="image/png")),
                user(text("Please analyze the image above.")),
            ],
        }.get(params.name)
        if messages is None:
            raise MCPError(types.INVALID_PARAMS, f"no prompt {params.name}")
        return types.GetPromptResult(messages=messages)

    async def complete(self, ctx: Ctx, params: types.CompleteRequestParams) -> types.CompleteResult:
        words = [w for w in ("paris", "park", "party") if w.startswith(params.argument.value)]
        return types.CompleteResult(completion=types.Completion(values=words, total=len(words), has_more=False))

    async def set_level(self, ctx: Ctx, params: types.SetLevelRequestParams) -> types.EmptyResult:
        return types.EmptyResult()


async def never_acknowledged(_: Ctx, __: types.SubscriptionsListenRequestParams) -> types.SubscriptionsListenResult:
    """A listen stream this server takes and never acknowledges."""
    await anyio.sleep_forever()
    raise AssertionError("sleep_forever returned")  # it does not: this only types the handler


def resource(uri: str, said: str, mime: str = "text/plain") -> types.EmbeddedResource:
    return types.EmbeddedResource(
        type="resource", resource=types.TextResourceContents(uri=uri, mime_type=mime, text=said)
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--mute-listen", action="store_true", help="never acknowledge subscriptions/listen")
    options = parser.parse_args()
    server = Conformance(mute_listen=options.mute_listen).server
    serve_on_loopback(server, options.port, event_store=MemoryEvents(), retry_interval=1000)


if __name__ == "__main__":
    main()
