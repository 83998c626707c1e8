"""Undo that real tools can express: CEL over the call's arguments, its result and the state a
read-only tool gave before it (a before-image), checked when the gateway starts against what the
servers list, and a call refused before anything is sent when its undo cannot be registered."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml
from mcp import Client
from mcp.shared.exceptions import MCPError

from tests.cluster.test_mcp_gateway import only_saga, tracker  # noqa: F401 (fixtures)
from tests.conftest import Cluster
from tests.support.gateway_process import GatewayProcess
from tests.support.manifests import webhook
from tests.support.mcp_tracker import Tracker
from tests.support.waiting import saga_phase
from undolog.kube import Kube

pytestmark = pytest.mark.cluster

MAPPINGS: dict[str, Any] = {
    "tracker.file_issues": {
        "compensation": {"tool": "tracker.close_issues", "args": {"numbers": "${output.issues.map(i, i.number)}"}}
    },
    "tracker.retitle_issue": {
        "before": {"tool": "tracker.get_issue", "args": {"number": "${args.number}"}},
        "compensation": {
            "tool": "tracker.retitle_issue",
            "args": {"number": "${args.number}", "title": "${before.title}"},
        },
    },
}


def configured(namespace: str, tracker: Tracker, tools: dict[str, Any]) -> dict[str, Any]:  # noqa: F811
    return {"namespace": namespace, "upstreams": {"tracker": {"url": tracker.url}}, "tools": tools}


@pytest.fixture
def gateway(cluster: Cluster, namespace: str, tracker: Tracker, tmp_path: Path) -> Iterator[GatewayProcess]:  # noqa: F811
    process = GatewayProcess(cluster.kubeconfig, configured(namespace, tracker, MAPPINGS), tmp_path)
    yield process
    process.stop()


@pytest_asyncio.fixture
async def undo_webhooks(kube: Kube, namespace: str, tracker: Tracker) -> None:  # noqa: F811
    for tool in ("close_issues", "retitle_issue"):
        name = f"tracker.{tool.replace('_', '-')}"
        await kube.create("webhooks", namespace, webhook(name, url=tracker.url, mcp={"tool": tool}))


@pytest.mark.usefixtures("undo_webhooks", "operator")
async def test_a_projection_and_a_before_image_undo_every_step(
    kube: Kube,
    namespace: str,
    tracker: Tracker,  # noqa: F811
    gateway: GatewayProcess,
) -> None:
    async with Client(gateway.url, mode="legacy") as agent:
        filed = await agent.call_tool("file_issues", {"titles": ["a", "b", "c"]})
        assert not filed.is_error, filed
        assert not (await agent.call_tool("retitle_issue", {"number": 2, "title": "b, renamed"})).is_error
        assert tracker.issues.opened[2]["title"] == "b, renamed"
        await agent.call_tool("undolog_abort", {"reason": "undo both"})
    name = await only_saga(kube, namespace)
    await saga_phase(kube, namespace, name, "Compensated")
    assert tracker.issues.opened[2]["title"] == "b"  # the title from before the call, put back first
    assert sorted(close.number for close in tracker.issues.closes) == [1, 2, 3]
    entries = {e["spec"]["step"]: e for e in await kube.list("undoentries", namespace)}
    print(f"\nentries: {[(s, e['spec']['compensation']['args']) for s, e in entries.items()]}")
    assert entries["retitle_issue-2"]["spec"]["compensation"]["args"] == {"number": 2, "title": "b"}
    assert entries["file_issues-1"]["status"]["output"]["undolog_undo"] == {"e0": [1, 2, 3]}


@pytest.mark.usefixtures("undo_webhooks", "operator")
async def test_a_before_image_that_cannot_be_read_refuses_the_call_and_nothing_is_sent(
    namespace: str,
    tracker: Tracker,  # noqa: F811
    gateway: GatewayProcess,
) -> None:
    async with Client(gateway.url, mode="legacy") as agent:
        with pytest.raises(
            MCPError,
            match=r"not called: the state before it could not be read \(tracker\.get_issue: Error executing",
        ):
            await agent.call_tool("retitle_issue", {"number": 9, "title": "x"})
    assert tracker.issues.opened == {}


@pytest.mark.parametrize(
    ("tools", "said"),
    [
        (
            {"tracker.file_issues": {"compensation": {"tool": "tracker.close_issues", "args": {"n": "${output.}"}}}},
            "tools.tracker.file_issues.compensation.args: ${output.} does not compile",
        ),
        (
            {
                "tracker.file_issues": {
                    "compensation": {"tool": "tracker.close_issues", "args": {"n": "${output.issues.map(i, i.numbr)}"}}
                }
            },
            "tools.tracker.file_issues.compensation.args: ${output.issues.map(i, i.numbr)} names a field its schema "
            "does not have",
        ),
        (  # close_issues takes a list of numbers; one issue's number is an integer
            {
                "tracker.file_issues": {
                    "compensation": {"tool": "tracker.close_issues", "args": {"numbers": "${output.issues[0].number}"}}
                }
            },
            "tools.tracker.file_issues.compensation.args.numbers: ${output.issues[0].number} gives integer, where the "
            "tool's schema says array",
        ),
    ],
)
def test_a_mapping_that_cannot_work_is_refused_at_start_naming_the_tool_and_the_expression(
    cluster: Cluster,
    namespace: str,
    tracker: Tracker,  # noqa: F811
    tmp_path: Path,
    tools: dict[str, Any],
    said: str,
) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump({"auth": "none", **configured(namespace, tracker, tools)}))
    ran = subprocess.run(
        [sys.executable, "-m", "undolog.cli", "mcp", "--config", str(path), "--kubeconfig", str(cluster.kubeconfig)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    print(f"\n{ran.stderr.strip().splitlines()[-1]}")
    assert ran.returncode != 0
    assert said in ran.stderr
