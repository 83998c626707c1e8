"""The connection options are declared once (cli/connection.py) and every command that talks to
the API takes them after its name, as kubectl's commands do."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.main import get_group
from typer.testing import CliRunner

from undolog.cli.app import app

SHARED = {"--context", "--kubeconfig", "--as", "--as-group"}
NAMESPACED = ["list", "show", "plan", "retry", "skip", "abort", "rewind", "wait", "history"]


def options_of(command: str) -> set[str]:
    return {opt for param in get_group(app).commands[command].params for opt in getattr(param, "opts", ())}


@pytest.mark.parametrize("command", NAMESPACED)
def test_each_triage_command_takes_the_namespace_and_the_user_options(command: str) -> None:
    assert {"--namespace", "-n", *SHARED} <= options_of(command)


@pytest.mark.parametrize("command", ["dashboard", "verify"])
def test_the_dashboard_and_verify_take_the_user_options(command: str) -> None:
    assert options_of(command) >= SHARED


def test_the_options_after_the_command_reach_the_client(tmp_path: Path) -> None:
    """The kubeconfig, context and namespace given after `show` are the ones used: its server
    (nothing listens on port 1 of loopback) is the one the error names."""
    config = tmp_path / "config"
    config.write_text(
        """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: elsewhere, context: {cluster: c, user: u, namespace: team-a}}]
current-context: elsewhere
"""
    )
    result = CliRunner().invoke(app, ["show", "s1", "--kubeconfig", str(config), "--context", "elsewhere", "-n", "b"])
    assert result.exit_code == 1
    assert "127.0.0.1:1" in result.output
