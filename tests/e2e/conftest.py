"""`make e2e`: the chart installed with the image built here, on a real node (kubelet, containerd,
runc) of a control plane of the module's own. Needs root; `make e2e` builds what it needs."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio
from devtools.control_plane import LocalControlPlane

from tests.conftest import BIN, REPO, Cluster
from undolog.kube import Kube

IMAGES = (REPO / "build" / "pause-image.oci.tar", REPO / "build" / "undolog-image.oci.tar")


@pytest.fixture(scope="session")
def node_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    missing = [str(image) for image in IMAGES if not image.is_file()]
    if missing:
        pytest.fail(f"{', '.join(missing)} not found: run `make image` (make e2e does)")
    local = LocalControlPlane(tmp_path_factory.mktemp("node-cluster"), BIN, node=True, images=IMAGES)
    endpoints = local.up()
    print(f"\ncontrol plane and node ready in {endpoints.started_in_seconds:.1f} s at {endpoints.server}")
    try:
        yield Cluster(endpoints.kubeconfig, local)
    finally:
        local.down()


@pytest_asyncio.fixture(scope="session")
async def node_kube(node_cluster: Cluster) -> AsyncIterator[Kube]:
    connection = await Kube.connect(str(node_cluster.kubeconfig))
    yield connection
    await connection.close()
