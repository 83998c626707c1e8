"""`undolog mcp` as a process on a free loopback port, for tests and benchmarks, and the
configuration that puts it in front of the tracker with create_issue undone by close_issue."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from devtools.control_plane.local import free_port

from tests.support.mcp_tracker import Tracker
from tests.support.waiting import serving


def gateway_config(namespace: str, tracker: Tracker, **overrides: Any) -> dict[str, Any]:
    return {
        "namespace": namespace,
        "upstreams": {"tracker": {"url": tracker.url}},
        "tools": {
            "tracker.create_issue": {
                "compensation": {"tool": "tracker.close_issue", "args": {"number": "${output.number}"}}
            },
        },
        **overrides,
    }


HANDLE_KEY = "the-test-gateways-handle-key"  # every replica of a test shares it, as the chart's Secret gives it


class GatewayProcess:
    """The gateway as a process. A configuration without `auth` is served with `auth: none`: the
    tests of everything but authentication call it as anyone (the gateway itself refuses a
    configuration that does not say)."""

    def __init__(
        self,
        kubeconfig: Path,
        config: dict[str, Any],
        tmp_path: Path,
        *extra: str,
        handle_key: str = HANDLE_KEY,
        port: int | None = None,
    ) -> None:
        self.port = port or free_port()
        path = tmp_path / f"gateway-{self.port}.yaml"
        path.write_text(yaml.safe_dump({"auth": "none", **config}))
        self.log_path = tmp_path / f"gateway-{self.port}.log"
        self.log = self.log_path.open("w")
        command = [sys.executable, "-m", "undolog.cli", "mcp", "--config", str(path), "--port", str(self.port)]
        self.process = subprocess.Popen(
            [*command, "--kubeconfig", str(kubeconfig), *extra],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "UNDOLOG_GATEWAY_HANDLE_KEY": handle_key},
        )
        serving(f"http://127.0.0.1:{self.port}/healthz", self.process, self.log_path, 30)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(15)
        self.log.close()

    def kill(self) -> None:
        """kill -9: whatever it held in memory is gone."""
        self.process.kill()
        self.process.wait(15)
        self.log.close()
