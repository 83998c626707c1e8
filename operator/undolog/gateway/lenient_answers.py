"""What an upstream answers that the `mcp` package's client would refuse, read as the server
meant it (the conformance repository's reference server answers both ways):

- several JSON-RPC messages in one `application/json` body, one a line (a notice before the
  result), read as the event stream they stand for;
- a result of the stateless revision (2026-07-28) without `resultType`, read as `complete`,
  which is what its absence means (mcp_types.ResultType), though that revision's schema and
  so the client require it.

And an answer's event stream the client closes as soon as it has the answer is read to its end
first (the server ends it right after), so the connection is used again instead of dropped: the
SDK's client closed it mid-stream, which cost every session-era call a new TCP connection.

Hand-written: the SDK's client has no lenient mode, and its transport takes an HTTP client."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx2
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

PROTOCOL_HEADER = "mcp-protocol-version"
SENT_AS = frozenset({"content-length", "content-encoding", "transfer-encoding"})
MAX_BODY_BYTES = 64 << 20  # an answer read whole to mend it; past this, passed on as it came
EVENT_STREAM = "text/event-stream"
# What is read of an event stream the client closed before its end, at most, to keep the
# connection: a server that goes on sending (or stalls) loses it, as before.
REST_SECONDS = 0.5
REST_BYTES = 64 << 10


class LenientAnswers(httpx2.AsyncBaseTransport):
    def __init__(self, inner: httpx2.AsyncBaseTransport) -> None:
        self.inner = inner

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self.inner.handle_async_request(request)
        kind = response.headers.get("content-type", "")
        if request.method == "POST" and kind.startswith(EVENT_STREAM):
            if isinstance(response.stream, httpx2.AsyncByteStream):
                response.stream = ReadToItsEnd(response.stream)
            return response
        length = int(response.headers.get("content-length") or 0)
        if request.method != "POST" or not kind.startswith("application/json") or length > MAX_BODY_BYTES:
            return response
        body = await response.aread()  # decoded: the headers that described the bytes as sent go
        headers = {k: v for k, v in response.headers.items() if k not in SENT_AS}
        mended = mend(body, request.headers.get(PROTOCOL_HEADER) in MODERN_PROTOCOL_VERSIONS)
        content, headers["content-type"] = mended if mended is not None else (body, kind)
        return httpx2.Response(response.status_code, headers=headers, content=content, extensions=response.extensions)

    async def aclose(self) -> None:
        await self.inner.aclose()


class ReadToItsEnd(httpx2.AsyncByteStream):
    """An answer's event stream that, closed before its end, reads the rest first (bounded by
    REST_SECONDS and REST_BYTES): a connection closed mid-answer cannot be used again."""

    def __init__(self, inner: httpx2.AsyncByteStream) -> None:
        self.inner = inner
        self.chunks = aiter(inner)  # one iterator: what the client left unread is read on from it

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.chunks:
            yield chunk

    async def aclose(self) -> None:
        try:
            with contextlib.suppress(TimeoutError, httpx2.HTTPError):
                async with asyncio.timeout(REST_SECONDS):
                    left = REST_BYTES
                    async for chunk in self.chunks:
                        left -= len(chunk)
                        if left < 0:
                            break
        finally:
            await self.inner.aclose()


def mend(body: bytes, modern: bool) -> tuple[bytes, str] | None:
    """The body as the client reads it, and its content type; None when the client reads it as
    it came. One message stays JSON; several, one a line, become events."""
    try:
        one = json.loads(body)
    except ValueError:
        try:
            messages = [json.loads(line) for line in body.splitlines() if line.strip()]
        except ValueError:
            return None  # neither: the client says what it cannot read
        events = (json.dumps(completed(m) if modern else m) for m in messages)
        return b"".join(b"data: " + event.encode() + b"\n\n" for event in events), "text/event-stream"
    if not modern or completed(one) is one:
        return None
    return json.dumps(completed(one)).encode(), "application/json"


def completed(message: Any) -> Any:
    """A response whose result lacks `resultType`, with `complete`; anything else as it is."""
    result = message.get("result") if isinstance(message, dict) else None
    if not isinstance(result, dict) or "resultType" in result:
        return message
    return {**message, "result": {**result, "resultType": "complete"}}
