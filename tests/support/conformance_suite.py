"""The MCP conformance suite's server scenarios, run from its own packages (tests/conformance,
`make mcp-conformance`) on Node 22: the latest release for the session era, the alpha that
carries the requirements of the stateless revision for 2026-07-28."""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from devtools.control_plane.local import free_port

from tests.conftest import REPO
from tests.support.loopback_mcp import served

MODULES = REPO / "tests" / "conformance" / "node_modules"
EVERYTHING = REPO / "tests" / "mcp_servers" / "node_modules" / ".bin" / "mcp-server-everything"
NODE = MODULES / ".bin" / "node"
ERAS = {  # the suite's package, and how it is asked for the era's scenarios
    "2025-11-25": (MODULES / "@modelcontextprotocol" / "conformance", ()),
    "2026-07-28": (MODULES / "conformance-2026", ("--requirements", "2026-07-28")),
}
SCENARIO = re.compile(r"^[✓✗] ([a-z0-9-]+): (\d+) passed, (\d+) failed", re.MULTILINE)


def scenarios(url: str, era: str, work: Path) -> dict[str, bool]:
    """Each server scenario the suite runs for `era`: whether every one of its checks passed."""
    package, chosen = ERAS[era]
    command = [str(NODE), str(package / "dist" / "index.js"), "server", "--url", url, *chosen]
    ran = subprocess.run(command, cwd=work, capture_output=True, text=True, timeout=900, check=False)
    found = {name: int(failed) == 0 for name, _, failed in SCENARIO.findall(ran.stdout)}
    assert found, ran.stdout[-3000:] + ran.stderr[-3000:]
    return found


@contextmanager
def upstream(work: Path, *flags: str) -> Iterator[str]:
    """The server written to the suite's specification (tests/support/conformance_server.py),
    with its `flags` (`--mute-listen`)."""
    with served("conformance_server", work, *flags) as url:
        yield url


@contextmanager
def everything(work: Path) -> Iterator[str]:
    """`@modelcontextprotocol/server-everything` from npm (tests/mcp_servers): the protocol
    project's server that exercises every feature, on streamable HTTP."""
    port = free_port()
    log = work / f"server-everything-{port}.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [str(NODE), str(EVERYTHING), "streamableHttp"],
            stdout=out,
            stderr=out,
            env={**os.environ, "PORT": str(port)},
        )
    try:
        deadline = time.monotonic() + 30
        while f"listening on port {port}" not in log.read_text():  # it serves nothing that answers 200
            if time.monotonic() > deadline or process.poll() is not None:
                raise AssertionError(f"server-everything did not start in 30 s: {log.read_text()[-2000:]}")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(10)
