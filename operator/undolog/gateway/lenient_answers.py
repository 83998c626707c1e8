"""What an upstream answers that the `mcp` package's client would refuse, read as the server
meant it (the conformance repository's reference server answers both ways):

- several JSON-RPC messages in one `application/json` body, one a line (a notice before the
  result), read as the event stream they stand for;
- a result of the stateless revision (2026-07-28) without `resultType`, read as `complete`,
  which is what its absence means (mcp_types.ResultType), though that revision's schema and
  so the client require it.

Hand-written: the SDK's client has no lenient mode, and its transport takes an HTTP client."""

from __future__ import annotations

import json
from typing import Any

import httpx2
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

PROTOCOL_HEADER = "mcp-protocol-version"
SENT_AS = frozenset({"content-length", "content-encoding", "transfer-encoding"})
MAX_BODY_BYTES = 64 << 20  # an answer read whole to mend it; past this, passed on as it came


class LenientAnswers(httpx2.AsyncBaseTransport):
    def __init__(self, inner: httpx2.AsyncBaseTransport) -> None:
        self.inner = inner

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self.inner.handle_async_request(request)
        kind = response.headers.get("content-type", "")
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
