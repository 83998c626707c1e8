"""The MCP transport: a compensation that is a tool on an MCP server (a Webhook version with
`mcp.tool`), called with `tools/call` by the `mcp` package's client.

The client's HTTP goes over the HTTP transport's own session (`Carrier`), so an MCP call meets
the same egress policy, fence, TLS, slots, answer cap and signatures as any other call; only the
protocol on top differs. The call's Idempotency-Key travels in the request's `_meta`
(`io.undolog/idempotency-key`) and as the HTTP header, on every request of the exchange.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any, cast

import aiohttp
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, PARSE_ERROR, CallToolResult, RequestParamsMeta, TextContent
from yarl import URL

from undolog.calls.http import HttpTransport, success
from undolog.calls.signing import webhook_headers
from undolog.calls.transport import PreparedCall, Target
from undolog.conventions import MAX_ANSWER_BYTES, MAX_ERROR_TEXT, now
from undolog.decisions.retry import CallOutcome, Verdict
from undolog.errors import NotLeading

KEY_META = "io.undolog/idempotency-key"
READ_CHUNK = 64 * 1024
# Headers httpx sets that aiohttp sets again from the request it writes.
OWN_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection"})


class AnswerTooLarge(httpx2.ReadError):
    """More than MAX_ANSWER_BYTES in one answer: the connection is closed on the rest."""


class _Capped(httpx2.AsyncByteStream):
    def __init__(self, response: aiohttp.ClientResponse, carrier: Carrier) -> None:
        self.response, self.carrier = response, carrier

    async def __aiter__(self) -> AsyncIterator[bytes]:
        read = 0
        while chunk := await self.response.content.read(READ_CHUNK):
            read += len(chunk)
            if read > MAX_ANSWER_BYTES:
                self.response.close()
                self.carrier.too_large(self.response.status)
                raise AnswerTooLarge(f"an answer larger than {MAX_ANSWER_BYTES} bytes: the rest was not read")
            yield chunk

    async def aclose(self) -> None:
        self.response.release()


class Carrier(httpx2.AsyncBaseTransport):
    """httpx's requests sent by the HTTP transport's aiohttp session. What the network did is
    kept in `failure` (the MCP client wraps it in errors of its own), the last status in `status`;
    a fence that refused a request before the tools/call left, in `refused`: nothing was called."""

    def __init__(self, http: HttpTransport, target: Target, headers: dict[str, str], context: Any) -> None:
        self.http, self.target, self.headers, self.context = http, target, headers, context
        self.failure: CallOutcome | None = None
        self.status: int | None = None
        self.refused: NotLeading | None = None
        self.called = False  # the tools/call request has left

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        body = await request.aread()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in OWN_HEADERS}
        headers.update(self.headers)
        key = self.headers.get("Idempotency-Key", "")
        headers.update(webhook_headers(key, body, self.target.signing_keys, now()))
        try:
            response = await self.http.request(
                request.method, URL(str(request.url), encoded=True), body, headers, self.context
            )
        except NotLeading as refused:
            if self.called:  # the tool may have acted: a failed attempt, asked again under its key
                self.failure = self.http.failure(refused, self.target)
            else:
                self.refused = refused
            raise httpx2.ConnectError(str(refused)) from refused
        except Exception as error:
            self.failure = self.http.failure(error, self.target)
            raise httpx2.ConnectError(self.failure.error or type(error).__name__) from error
        self.called = self.called or calls_the_tool(body)
        self.status = response.status
        return httpx2.Response(response.status, headers=list(response.headers.items()), stream=_Capped(response, self))

    def too_large(self, status: int) -> None:
        # The tool's result is in the answer: one too large to read is no success, and asked
        # again under its key the tool would answer the same. A person looks at it.
        self.failure = CallOutcome(
            status_code=status,
            error=f"tool {self.target.tool!r} answered more than {MAX_ANSWER_BYTES} bytes: the rest was not read "
            "(connection closed), so its result is unknown and the effect may have happened",
            verdict=Verdict.PERMANENT,
        )


class McpTransport:
    """`tools/call` of the target's tool with the call's arguments: a result is its output
    (structuredContent, or a text that is a JSON object); `isError` and a JSON-RPC error are
    the participant's answer (permanent, but an internal error is retried); the network's
    failures are the HTTP transport's."""

    def __init__(self, http: HttpTransport) -> None:
        self.http = http

    async def close(self) -> None:
        return None  # the HTTP transport's session carries the calls, and closes with it

    async def send(self, call: PreparedCall) -> CallOutcome:
        target = call.target
        admitted = self.http.admitted(target)
        if isinstance(admitted, CallOutcome):
            return admitted
        carrier = Carrier(self.http, target, {**target.headers, **call.headers}, admitted)
        key = call.headers.get("Idempotency-Key", "")
        try:
            async with self.http.slots.hold(target.url), asyncio.timeout(target.timeout_seconds):
                call.leaving()
                result = await tools_call(carrier, call.body, key)
            return answered(target.tool or "", carrier.status or 200, result)
        except TimeoutError:
            return CallOutcome(error=f"timed out after {target.timeout_seconds:g} s")
        except Exception as error:  # the MCP client wraps what the network did (kept by the carrier)
            if carrier.refused is not None:
                raise carrier.refused from error  # as the HTTP transport does: nothing was sent, no attempt
            if (answer := json_rpc_error(error)) is not None:
                return refused_by(target.tool or "", carrier.status, answer)
            if carrier.failure is not None:
                return carrier.failure
            text = f"MCP: {type(error).__name__}: {error}"[:MAX_ERROR_TEXT]
            if carrier.status is not None and not 200 <= carrier.status < 300:  # judged as HTTP judges it
                return CallOutcome(status_code=carrier.status, error=f"HTTP {carrier.status}: {text}"[:MAX_ERROR_TEXT])
            return CallOutcome(error=text)


def calls_the_tool(body: bytes) -> bool:
    """Whether a request of the exchange is the tools/call (the others are the handshake and
    the session's end)."""
    try:
        message = json.loads(body)
    except ValueError:
        return False
    return isinstance(message, dict) and message.get("method") == "tools/call"


# JSON-RPC errors that say nothing of the call itself: asked again. Every other code (invalid
# parameters, no such method or tool, a server's own application errors) is the tool's answer.
TRANSIENT_CODES = frozenset({INTERNAL_ERROR, PARSE_ERROR})


def json_rpc_error(error: BaseException) -> MCPError | None:
    """The JSON-RPC error a server answered, however the client wrapped it (its task group
    raises an ExceptionGroup around it)."""
    if isinstance(error, MCPError):
        return error
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            if (found := json_rpc_error(inner)) is not None:
                return found
    return json_rpc_error(error.__cause__) if error.__cause__ is not None else None


def refused_by(tool: str, status: int | None, error: MCPError) -> CallOutcome:
    """A tool's JSON-RPC error as an outcome: classified by its code, said in its own words."""
    verdict = Verdict.TRANSIENT if error.code in TRANSIENT_CODES else Verdict.PERMANENT
    text = f"MCP error {error.code} from tool {tool!r}: {error.error.message}"
    return CallOutcome(status_code=status, error=text[:MAX_ERROR_TEXT], verdict=verdict)


def keyed_meta(key: str) -> RequestParamsMeta:
    """A request's `_meta` carrying the Idempotency-Key (an open map the type cannot spell)."""
    return cast(RequestParamsMeta, {KEY_META: key})


async def tools_call(carrier: Carrier, arguments: dict[str, Any], key: str) -> CallToolResult:
    """One session with the server (the handshake its protocol needs, the call, its end)."""
    target = carrier.target
    async with (
        httpx2.AsyncClient(transport=carrier, trust_env=False, timeout=None) as http,
        Client(streamable_http_client(target.url, http_client=http), cache=None) as client,
    ):
        return await client.call_tool(target.tool or "", arguments, meta=keyed_meta(key))


def answered(tool: str, status: int, result: CallToolResult) -> CallOutcome:
    """A tool's result as an outcome: its output is structuredContent, or a lone text that is a
    JSON object (servers that predate structured output); isError is a permanent failure with
    its text, and its output is kept all the same (what a partial effect left, for whoever
    undoes it)."""
    texts = [block.text for block in result.content if isinstance(block, TextContent)]
    if isinstance(result.structured_content, dict):
        outcome = CallOutcome(status_code=status, output=result.structured_content)
    elif len(texts) == 1:
        outcome = success(status, texts[0].encode(), "text/plain")
    else:
        outcome = CallOutcome(status_code=status)
    if not result.is_error:
        return replace(outcome, state=result_value(result))
    said = " ".join(t.strip() for t in texts)[:MAX_ERROR_TEXT] or "no text"
    text = f"tool {tool!r} answered isError: {said}"
    return CallOutcome(
        status_code=status, error=text[:MAX_ERROR_TEXT], verdict=Verdict.PERMANENT, output=outcome.output
    )


def result_value(result: CallToolResult) -> Any:
    """A tool's result as an expression reads it: its structuredContent, else its lone text as
    JSON, else its text (`{"text": ...}`)."""
    if result.structured_content is not None:
        return result.structured_content
    texts = [b.text for b in result.content if isinstance(b, TextContent)]
    if len(texts) == 1:
        try:
            return json.loads(texts[0])
        except ValueError:
            pass
    return {"text": "\n".join(texts)} if texts else None
