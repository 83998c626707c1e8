"""A plain round-robin HTTP proxy on loopback, in a thread of the test: each request goes to
the next backend in turn; a backend that refuses the connection is passed over for the next
(as a load balancer's health check would, a moment later). Responses are streamed back, so
server-sent events pass through."""

from __future__ import annotations

import asyncio
import itertools
import threading

import aiohttp
from aiohttp import web
from devtools.control_plane.local import free_port

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "host", "content-length"}


class RoundRobin:
    def __init__(self, backends: list[str], added: dict[str, str] | None = None) -> None:
        """`added`: headers put on every request (a client's bearer token, for one that cannot send it)."""
        self.backends = backends  # base URLs, http://127.0.0.1:<port>
        self.added = added or {}
        self.turns = itertools.cycle(range(len(backends)))
        self.served: list[str] = []  # the backend of each request, in order
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._serve, name="round-robin", daemon=True)
        self.thread.start()
        if not self.ready.wait(15):
            raise RuntimeError("the round-robin proxy did not start")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        app.router.add_route("*", "/{path:.*}", self.forward)
        self.runner = web.AppRunner(app, handler_cancellation=True)  # a client gone: its relay stops
        self.loop.run_until_complete(self.runner.setup())
        self.loop.run_until_complete(web.TCPSite(self.runner, "127.0.0.1", self.port).start())
        self.session = self.loop.run_until_complete(self._session())
        self.ready.set()
        self.loop.run_forever()

    @staticmethod
    async def _session() -> aiohttp.ClientSession:
        return aiohttp.ClientSession(auto_decompress=False)  # made on the loop that uses it

    async def forward(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP} | self.added
        for _ in self.backends:
            backend = self.backends[next(self.turns)]
            try:
                upstream = await self.session.request(
                    request.method, backend + request.path_qs, headers=headers, data=body, allow_redirects=False
                )
            except aiohttp.ClientConnectionError:
                continue  # down: the next one
            self.served.append(backend)
            answer = web.StreamResponse(status=upstream.status)
            for key, value in upstream.headers.items():
                if key.lower() not in HOP_BY_HOP:
                    answer.headers[key] = value
            await answer.prepare(request)
            async for chunk in upstream.content.iter_any():
                await answer.write(chunk)
            await answer.write_eof()
            upstream.release()
            return answer
        return web.Response(status=502, text="no backend answered")

    def stop(self) -> None:
        async def closing() -> None:
            await self.session.close()
            await self.runner.cleanup()

        asyncio.run_coroutine_threadsafe(closing(), self.loop).result(15)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(15)
