"""An MCP server of tests/support run as its own process on streamable HTTP on loopback, and
served before its address is handed out: what a test times is the protocol, not the server's
start."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from devtools.control_plane.local import free_port

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
