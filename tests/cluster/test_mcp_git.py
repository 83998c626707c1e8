"""The protocol project's git server (mcp-server-git, PyPI), whose tools answer text: a checkout
undone with a CEL expression over git_status's text, as docs/mcp.md maps it, on the real server
run as a stdio command of the gateway."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from tests.cluster.test_mcp_catalog import serving_operator_calls
from tests.cluster.test_mcp_gateway import only_saga
from tests.cluster.test_mcp_stateless import HANDLE, handle_of
from tests.conftest import Cluster
from tests.support.waiting import saga_phase
from undolog.kube import Kube

pytestmark = pytest.mark.cluster
SERVER = Path(sys.executable).parent / "mcp-server-git"
# git_status answers "Repository status:\nOn branch <name>\n...": the branch from before, read
# out of that text with the strings library.
BRANCH_BEFORE = "${before.text.split('\\n')[1].substring(10)}"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def repository(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "--allow-empty", "-m", "first")
    git(repo, "branch", "feature/login")
    return repo


def git_config(repo: Path) -> dict[str, Any]:
    args = {"repo_path": "${args.repo_path}"}
    return {
        "upstreams": {"git": {"command": [str(SERVER), "--repository", str(repo)]}},
        "tools": {
            "git.git_checkout": {
                "before": {"tool": "git.git_status", "args": args},
                "compensation": {"tool": "git.git_checkout", "args": args | {"branch_name": BRANCH_BEFORE}},
            },
            "git.git_status": {"readOnly": True},
        },
    }


@pytest.mark.usefixtures("operator")
async def test_a_checkout_is_undone_with_the_branch_read_out_of_git_status_s_text(
    cluster: Cluster, kube: Kube, namespace: str, tmp_path: Path
) -> None:
    repo = repository(tmp_path)
    gateway = await serving_operator_calls(cluster.kubeconfig, kube, namespace, tmp_path, git_config(repo))
    try:
        async with Client(gateway.url) as agent:
            called = await agent.call_tool("git_checkout", {"repo_path": str(repo), "branch_name": "feature/login"})
            assert not called.is_error, called
            assert git(repo, "branch", "--show-current").strip() == "feature/login"
            await agent.call_tool("undolog_abort", {HANDLE: handle_of(called), "reason": "wrong branch"})
        name = await only_saga(kube, namespace)
        await saga_phase(kube, namespace, name, "Compensated", within=60)
    finally:
        gateway.stop()
    assert git(repo, "branch", "--show-current").strip() == "main"
    entry = (await kube.list("undoentries", namespace))[0]
    assert entry["spec"]["compensation"]["args"]["branch_name"] == "main"
