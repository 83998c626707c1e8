"""`undolog mcp` as a process on a free loopback port, for tests and benchmarks, and the
configuration that puts it in front of the tracker with create_issue undone by close_issue."""

from __future__ import annotations

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


class GatewayProcess:
    def __init__(self, kubeconfig: Path, config: dict[str, Any], tmp_path: Path, *extra: str) -> None:
        path = tmp_path / "gateway.yaml"
        path.write_text(yaml.safe_dump(config))
        self.port = free_port()
        self.log = (tmp_path / "gateway.log").open("w")
        command = [sys.executable, "-m", "undolog.cli", "mcp", "--config", str(path), "--port", str(self.port)]
        self.process = subprocess.Popen(
            [*command, "--kubeconfig", str(kubeconfig), *extra], stdout=self.log, stderr=subprocess.STDOUT
        )
        serving(f"http://127.0.0.1:{self.port}/healthz", self.process, tmp_path / "gateway.log", 30)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(15)
        self.log.close()
