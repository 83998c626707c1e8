"""What an upstream answers that the `mcp` client would refuse, read as the server meant it."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
from collections.abc import AsyncIterator

import httpx2
import pytest
from aiohttp import web

from undolog.gateway.lenient_answers import LenientAnswers, mend

RESULT = {"jsonrpc": "2.0", "id": 1, "result": {"content": []}}
NOTICE = {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": "t", "progress": 1}}


def test_a_modern_result_without_result_type_reads_as_complete() -> None:
    mended = mend(json.dumps(RESULT).encode(), modern=True)
    assert mended is not None
    body, kind = mended
    assert kind == "application/json"
    assert json.loads(body)["result"] == {"content": [], "resultType": "complete"}


def test_what_the_client_reads_already_is_left_as_it_came() -> None:
    tagged = {**RESULT, "result": {"content": [], "resultType": "input_required"}}
    assert mend(json.dumps(tagged).encode(), modern=True) is None
    assert mend(json.dumps(RESULT).encode(), modern=False) is None  # the session era has no resultType
    assert mend(json.dumps({"jsonrpc": "2.0", "id": 1, "error": {"code": -1, "message": "no"}}).encode(), True) is None
    assert mend(b"<html>not json</html>", modern=True) is None


def test_messages_one_a_line_become_the_events_they_stand_for() -> None:
    body = (json.dumps(NOTICE) + "\n" + json.dumps(RESULT)).encode()
    mended = mend(body, modern=True)
    assert mended is not None
    events, kind = mended
    assert kind == "text/event-stream"
    said = [json.loads(line.removeprefix(b"data: ")) for line in events.split(b"\n\n") if line]
    assert said == [NOTICE, {**RESULT, "result": {"content": [], "resultType": "complete"}}]


@pytest.mark.parametrize(("version", "typed"), [("2026-07-28", True), ("2025-11-25", False)])
async def test_the_transport_mends_a_post_s_answer_by_the_request_s_revision(version: str, typed: bool) -> None:
    def answer(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers={"content-type": "application/json"}, json=RESULT)

    async with httpx2.AsyncClient(transport=LenientAnswers(httpx2.MockTransport(answer))) as client:
        response = await client.post("http://127.0.0.1/mcp", headers={"mcp-protocol-version": version}, json={})
    assert ("resultType" in response.json()["result"]) is typed


async def test_an_answer_sent_compressed_is_read_once() -> None:
    """The transport hands on the body it read (decompressed), so it must not say gzip again."""

    def answer(request: httpx2.Request) -> httpx2.Response:
        body = gzip.compress(json.dumps({**RESULT, "result": {"content": [], "resultType": "complete"}}).encode())
        return httpx2.Response(
            200, headers={"content-type": "application/json", "content-encoding": "gzip"}, content=body
        )

    async with httpx2.AsyncClient(transport=LenientAnswers(httpx2.MockTransport(answer))) as client:
        response = await client.post("http://127.0.0.1/mcp", headers={"mcp-protocol-version": "2026-07-28"}, json={})
    assert response.json()["result"]["resultType"] == "complete"


EVENT = b"event: message\ndata: " + json.dumps(RESULT).encode() + b"\n\n"


@contextlib.asynccontextmanager
async def event_server(ends: bool) -> AsyncIterator[tuple[str, set[int]]]:
    """A loopback server answering each POST with one event, as an MCP server answers a request
    (then ending the stream, or, `ends` False, keeping it open); the ids of the connections it
    served."""
    connections: set[int] = set()
    open_streams = asyncio.Event()

    async def answer(request: web.Request) -> web.StreamResponse:
        assert request.transport is not None
        connections.add(id(request.transport))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(EVENT)
        if not ends:
            await open_streams.wait()  # until the test ends
        await response.write_eof()
        return response

    application = web.Application()
    application.router.add_post("/mcp", answer)
    runner = web.AppRunner(application, handler_cancellation=True)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/mcp", connections
    finally:
        open_streams.set()
        await runner.cleanup()


async def answered_and_closed(client: httpx2.AsyncClient, url: str) -> None:
    """As the SDK's client reads a request's answer: the first event, then the stream closed."""
    async with client.stream("POST", url, json={}) as response:
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                assert json.loads(line.removeprefix("data: ")) == RESULT
                break
        await response.aclose()


async def test_an_event_stream_closed_after_its_answer_keeps_its_connection() -> None:
    async with (
        event_server(ends=True) as (url, connections),
        httpx2.AsyncClient(transport=LenientAnswers(httpx2.AsyncHTTPTransport())) as client,
    ):
        for _ in range(5):
            await asyncio.wait_for(answered_and_closed(client, url), timeout=10)
    assert len(connections) == 1


async def test_an_event_stream_that_goes_on_is_closed_all_the_same() -> None:
    async with (
        event_server(ends=False) as (url, connections),
        httpx2.AsyncClient(transport=LenientAnswers(httpx2.AsyncHTTPTransport())) as client,
    ):
        for _ in range(2):
            await asyncio.wait_for(answered_and_closed(client, url), timeout=10)
    assert len(connections) == 2  # each dropped, as before: nothing told its end
