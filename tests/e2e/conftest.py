"""`make e2e`: the chart installed with the image built here, on a real node (kubelet, containerd,
runc) of a control plane of the module's own. Needs root; `make e2e` builds what it needs."""

from __future__ import annotations

import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from devtools.control_plane import LocalControlPlane
from devtools.control_plane.node import BRIDGE, CHAIN, KUBELET_SYSCTLS

from tests.conftest import BIN, REPO, Cluster
from undolog.kube import Kube

IMAGES = (REPO / "build" / "pause-image.oci.tar", REPO / "build" / "undolog-image.oci.tar")


@pytest.fixture(scope="session")
def node_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    missing = [str(image) for image in IMAGES if not image.is_file()]
    if missing:
        pytest.fail(f"{', '.join(missing)} not found: run `make image` (make e2e does)")
    machine = host_settings()
    local = LocalControlPlane(tmp_path_factory.mktemp("node-cluster"), BIN, node=True, images=IMAGES)
    endpoints = local.up()
    print(f"\ncontrol plane and node ready in {endpoints.started_in_seconds:.1f} s at {endpoints.server}")
    try:
        yield Cluster(endpoints.kubeconfig, local)
    finally:
        begin = time.monotonic()
        local.down()
        print(f"node and control plane down in {time.monotonic() - begin:.1f} s")
        # The machine is as it was: kernel settings, no bridge, no rules, no mounts, no pods.
        assert host_settings() == machine
        assert subprocess.run(["ip", "link", "show", BRIDGE], capture_output=True, check=False).returncode != 0
        rules = subprocess.run(["iptables-save"], capture_output=True, text=True, check=True).stdout
        assert "KUBE-" not in rules
        assert CHAIN not in rules
        assert str(local.state_dir) not in Path("/proc/self/mounts").read_text()


def host_settings() -> dict[str, str]:
    return {key: Path("/proc/sys", key).read_text().strip() for key in KUBELET_SYSCTLS}


@pytest_asyncio.fixture(scope="session")
async def node_kube(node_cluster: Cluster) -> AsyncIterator[Kube]:
    connection = await Kube.connect(str(node_cluster.kubeconfig))
    yield connection
    await connection.close()
