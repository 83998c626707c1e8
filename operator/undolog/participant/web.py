"""The barrier at a participant's HTTP endpoints: an aiohttp handler and an ASGI app (Starlette,
FastAPI, any ASGI server) around the participant's own function, which makes its effect in the
transaction the barrier records the call in. `transaction` opens that transaction and gives
the barrier's Ledger and whatever the function needs (the connection)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from undolog.participant.barrier import Answer, Barrier, Call, Ledger

Transaction = Callable[[], AbstractAsyncContextManager[tuple[Ledger, Any]]]
Forward = Callable[[Any, Any], Awaitable[Answer]]  # (args, connection) -> answer
Compensation = Callable[[Any, Any, Answer], Awaitable[Answer]]  # (args, connection, forward's answer)


async def barriered(
    barrier: Barrier, transaction: Transaction, call: Call, forward: Forward | None, compensation: Compensation | None
) -> Answer:
    """The call through the barrier, in one transaction with the participant's effect."""
    async with transaction() as (ledger, connection):
        if forward is not None:
            return await barrier.forward(ledger, call, lambda args: forward(args, connection))
        assert compensation is not None
        return await barrier.compensate(ledger, call, lambda args, answer: compensation(args, connection, answer))


def aiohttp_handler(
    barrier: Barrier,
    transaction: Transaction,
    *,
    forward: Forward | None = None,
    compensation: Compensation | None = None,
) -> Callable[[Any], Awaitable[Any]]:
    """An aiohttp handler: `app.router.add_post("/charge", aiohttp_handler(barrier, tx, forward=charge))`."""
    from aiohttp import web

    async def handle(request: web.Request) -> web.Response:
        call = Call(dict(request.headers), await request.read())
        answer = await barriered(barrier, transaction, call, forward, compensation)
        return web.Response(status=answer.status, body=answer.encoded(), content_type="application/json")

    return handle


def asgi_app(
    barrier: Barrier,
    transaction: Transaction,
    *,
    forward: Forward | None = None,
    compensation: Compensation | None = None,
) -> Callable[[Any, Any, Any], Awaitable[None]]:
    """An ASGI app answering POSTs (mount it where the Webhook's URL points)."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        call = Call(headers, b"".join([chunk async for chunk in _body(receive)]))
        answer = await barriered(barrier, transaction, call, forward, compensation)
        body = answer.encoded()
        await send(
            {
                "type": "http.response.start",
                "status": answer.status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})

    return app


async def _body(receive: Any) -> AsyncIterator[bytes]:
    while True:
        message = await receive()
        yield message.get("body", b"")
        if not message.get("more_body"):
            return
