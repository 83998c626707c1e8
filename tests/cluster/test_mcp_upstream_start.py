"""An upstream the gateway cannot connect at start: the gateway does not start, and says which
upstream and why once the upstream's `connectSeconds` have passed. It never waits for ever (a
Deployment's pod would sit unready with nothing in its log) and never answers with a traceback.
Later, an agent's request that needs a new connection to an upstream that does not answer fails
as soon, saying so."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml
from devtools.control_plane.local import free_port
from mcp import Client
from mcp.shared.exceptions import MCPError

from tests.conftest import Cluster
from tests.support import conformance_suite
from tests.support.gateway_process import GatewayProcess
from tests.support.loopback_mcp import served
from tests.support.round_robin import RoundRobin

pytestmark = pytest.mark.cluster
HUNG = 60  # the gateway has not stopped by then: it waits for ever


@pytest.fixture
def silent() -> Iterator[str]:
    """An HTTP upstream on loopback that takes connections and never answers on them."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def hold() -> None:
        while True:
            try:
                held.append(listener.accept()[0])
            except OSError:  # closed: the test is over
                return

    threading.Thread(target=hold, daemon=True).start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}/mcp"
    listener.close()
    for connection in held:
        connection.close()


@pytest.fixture
def proxied(tmp_path: Path) -> Iterator[RoundRobin]:
    """The tests' upstream (it answers) behind a proxy a test can turn to another backend."""
    with conformance_suite.upstream(tmp_path) as url:
        proxy = RoundRobin([url.removesuffix("/mcp")])
        yield proxy
        proxy.stop()


def gateway_start(cluster: Cluster, namespace: str, tmp_path: Path, **upstreams: dict[str, Any]) -> tuple[int, str]:
    """`undolog mcp` with these upstreams, run until it ends: its exit status and output."""
    config = {"auth": "none", "namespace": namespace, "unmapped": "pass", "upstreams": upstreams}
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    command = [sys.executable, "-m", "undolog.cli", "mcp", "--config", str(path), "--port", str(free_port())]
    ran = subprocess.run(
        [*command, "--kubeconfig", str(cluster.kubeconfig)], capture_output=True, text=True, timeout=HUNG
    )
    return ran.returncode, ran.stdout + ran.stderr


@pytest.mark.parametrize("kind", ["http", "command"])
def test_an_upstream_that_never_answers_stops_the_start_naming_it_and_its_setting(
    cluster: Cluster, namespace: str, tmp_path: Path, silent: str, kind: str
) -> None:
    never = [sys.executable, "-c", "import time; time.sleep(600)"]  # reads nothing, says nothing
    upstream: dict[str, Any] = {"url": silent} if kind == "http" else {"command": never}
    status, said = gateway_start(cluster, namespace, tmp_path, slow=upstream | {"connectSeconds": 2})
    where = silent if kind == "http" else sys.executable  # the program alone: its arguments may hold a password
    assert status == 1, said
    assert f"upstream slow ({where}) did not answer within 2 s" in said
    assert "upstreams.slow.connectSeconds" in said
    assert "Traceback" not in said


def test_an_upstream_nothing_listens_for_stops_the_start_saying_why(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    closed = f"http://127.0.0.1:{free_port()}/mcp"
    status, said = gateway_start(cluster, namespace, tmp_path, slow={"url": closed})
    assert status == 1, said
    assert f"upstream slow ({closed}) could not be connected: ConnectError: All connection attempts failed" in said
    assert "Traceback" not in said


def test_the_upstreams_are_connected_together_and_each_that_fails_is_named(
    cluster: Cluster, namespace: str, tmp_path: Path, silent: str
) -> None:
    """One at a time, the start would have ended with the first that failed."""
    closed = f"http://127.0.0.1:{free_port()}/mcp"
    status, said = gateway_start(
        cluster, namespace, tmp_path, slow={"url": silent, "connectSeconds": 2}, gone={"url": closed}
    )
    assert status == 1, said
    assert f"upstream slow ({silent}) did not answer within 2 s" in said
    assert f"upstream gone ({closed}) could not be connected" in said
    assert "Traceback" not in said


def test_an_upstream_that_connects_and_never_lists_its_tools_stops_the_start(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    with served("mcp_mute_lister", tmp_path) as mute:
        status, said = gateway_start(cluster, namespace, tmp_path, slow={"url": mute, "connectSeconds": 2})
    assert status == 1, said
    assert "upstream slow did not list its tools within 2 s: check that it answers tools/list" in said
    assert "upstreams.slow.connectSeconds" in said
    assert "Traceback" not in said


def test_an_upstream_whose_tool_list_names_a_next_page_for_ever_stops_the_start(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    endless = {"command": [sys.executable, "-m", "tests.support.mcp_mute_lister", "--endless"]}
    status, said = gateway_start(cluster, namespace, tmp_path, paging=endless)
    assert status == 1, said
    assert "upstream paging could not list its tools: EndlessListing: tools/list named a next page after 100" in said
    assert "Traceback" not in said


async def test_a_session_s_new_connection_that_is_not_answered_fails_its_request_saying_so(
    cluster: Cluster, namespace: str, tmp_path: Path, proxied: RoundRobin, silent: str
) -> None:
    """The upstream answers while the gateway starts, then stops answering (the proxy turns to
    the silent server): an agent's first call opens its session's own connection. The proxy
    turns back before the gateway stops, whose shared connection says goodbye."""
    answering = proxied.backends[0]
    config = {
        "namespace": namespace,
        "unmapped": "pass",
        "upstreams": {"slow": {"url": proxied.url, "connectSeconds": 2}},
    }
    gateway = GatewayProcess(cluster.kubeconfig, config, tmp_path)
    try:
        proxied.backends[:] = [silent.removesuffix("/mcp")]
        with anyio.fail_after(HUNG):
            async with Client(gateway.url, mode="legacy") as agent:
                with pytest.raises(MCPError, match=r"upstream slow \(.*\) did not answer within 2 s"):
                    await agent.call_tool("test_simple_text", {})
    finally:
        proxied.backends[:] = [answering]
        gateway.stop()


async def test_a_gateway_whose_upstream_stopped_answering_still_stops(
    cluster: Cluster, namespace: str, tmp_path: Path, proxied: RoundRobin, silent: str
) -> None:
    """Its connections' goodbyes (a session's DELETE) go to an upstream that no longer answers:
    `stop` waits 15 s for the gateway to exit, and fails the test past that."""
    gateway = GatewayProcess(
        cluster.kubeconfig, {"namespace": namespace, "upstreams": {"slow": {"url": proxied.url}}}, tmp_path
    )
    try:
        proxied.backends[:] = [silent.removesuffix("/mcp")]
        gateway.stop()
        assert gateway.process.returncode == 0
    finally:
        if gateway.process.poll() is None:
            gateway.kill()
