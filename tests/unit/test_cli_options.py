"""The connection options are declared once (cli/connection.py) and every command that talks to
the API takes them after its name, as kubectl's commands do."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.main import get_group
from typer.testing import CliRunner

from undolog.cli.app import app
from undolog.version import __version__

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


def kubeconfig_at(path: Path, server: str, *, with_context: bool) -> Path:
    """A kubeconfig file with one cluster (and, if asked, the context and user that use it)."""
    contexts = (
        "contexts: [{name: here, context: {cluster: c, user: u}}]\ncurrent-context: here\n" if with_context else ""
    )
    path.write_text(
        f'apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: "{server}"}}}}]\n'
        f"users: [{{name: u, user: {{token: t}}}}]\n{contexts}"
    )
    return path


def test_kubeconfigs_listed_in_kubeconfig_are_merged_as_kubectl_merges_them(tmp_path: Path) -> None:
    """The first file names the context, the second defines nothing new: both are read, and
    the first one's cluster (port 1 of loopback, where nothing listens) is the one called."""
    first = kubeconfig_at(tmp_path / "a.yaml", "https://127.0.0.1:1", with_context=True)
    second = kubeconfig_at(tmp_path / "b.yaml", "https://127.0.0.1:2", with_context=False)
    result = CliRunner().invoke(app, ["show", "s1", "-n", "x"], env={"KUBECONFIG": f"{first}:{second}"})
    assert result.exit_code == 1
    assert "127.0.0.1:1" in result.output


def test_a_kubeconfig_that_does_not_exist_is_named() -> None:
    result = CliRunner().invoke(app, ["list", "-n", "x", "--kubeconfig", "/nonexistent/config"])
    assert result.exit_code == 1
    assert "no kubeconfig found at /nonexistent/config" in result.output


@pytest.mark.parametrize("asked", [["--version"], ["version"]])
def test_the_version_is_printed_both_ways(asked: list[str]) -> None:
    result = CliRunner().invoke(app, asked)
    assert result.exit_code == 0
    assert result.output == f"undolog {__version__}\n"


def test_without_the_cli_extra_the_command_says_how_to_get_it() -> None:
    """`pip install undolog` (the lean SDK) has no typer: a message, not a traceback."""
    blocked = "import sys; sys.modules['typer'] = None; from undolog.cli import main; main()"
    done = subprocess.run([sys.executable, "-c", blocked], capture_output=True, text=True, check=False)
    assert done.returncode == 1
    assert done.stderr.strip() == (
        "error: the undolog command needs typer, which `pip install undolog` leaves out: pip install 'undolog[cli]'"
    )


@pytest.mark.parametrize(
    "command",
    [
        ["operator", "--leader-election-namespace", "x", "--liveness-port", "0", "--metrics-port", "0"],
        ["mcp", "--port", "0"],
    ],
)
def test_a_long_running_command_given_a_kubeconfig_that_does_not_exist_names_it_in_one_line(
    command: list[str], tmp_path: Path
) -> None:
    """The operator and the gateway read the kubeconfig once they run: still one line, no traceback."""
    config = tmp_path / "gateway.yaml"
    config.write_text('auth: none\nnamespace: x\nupstreams:\n  a: {url: "http://127.0.0.1:1/mcp"}\n')
    extra = ["--config", str(config)] if command[0] == "mcp" else []
    argv = [sys.executable, "-m", "undolog.cli", *command, *extra, "--kubeconfig", "/nonexistent/config"]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.splitlines()[-1] == (  # after the gateway's warnings of its start
        "error: no kubeconfig found at /nonexistent/config: set KUBECONFIG or --kubeconfig, or run in a Pod"
    )
