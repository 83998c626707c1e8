"""An MCP server of tests/support run as its own process on streamable HTTP on loopback, and
served before its address is handed out: what a test times is the protocol, not the server's
start. And how such a server serves: /mcp, and /healthz once it does."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import uvicorn
from devtools.control_plane.local import free_port
from mcp.server.lowlevel import Server
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from tests.support.waiting import serving


@contextmanager
def served(module: str, work: Path, *flags: str) -> Iterator[str]:
    """`python -m tests.support.<module> --port N <flags>` until the block ends: its MCP URL once
    its /healthz answers."""
    port = free_port()
    log = work / f"{module}-{port}.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", f"tests.support.{module}", "--port", str(port), *flags], stdout=out, stderr=out
        )
    try:
        serving(f"http://127.0.0.1:{port}/healthz", process, log, 30)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(10)


def serve_on_loopback(server: Server[Any], port: int, **app_options: Any) -> None:
    """`server` on streamable HTTP at 127.0.0.1:`port` until the process is stopped (the SDK's
    `app_options` passed on: an event store, a retry interval)."""

    async def healthz(_: Request) -> Response:
        return PlainTextResponse("ok")

    app = server.streamable_http_app(
        streamable_http_path="/mcp",
        host="127.0.0.1",
        custom_starlette_routes=[Route("/healthz", healthz)],
        **app_options,
    )
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
