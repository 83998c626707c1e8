"""Fixtures shared by every test: a real Kubernetes API and a fresh namespace per test.

With KUBECONFIG set the tests run against that cluster (kind, k3d, a real one); otherwise a
local control plane (etcd, kube-apiserver, kube-controller-manager built by `make tools`) is
started on loopback for the session and stopped at the end.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio
from devtools.control_plane import LocalControlPlane
from devtools.crds import CRDS
from devtools.postgres import LocalPostgres

from tests.support.namespaces import fresh_namespace
from tests.support.operator_process import OperatorProcess
from tests.support.participants import Participant
from undolog.kube import Kube

REPO = Path(__file__).resolve().parents[1]
BIN = Path(os.environ.get("UNDOLOG_BIN_DIR", REPO / "bin"))
# tests/e2e runs pods on a real node (root, an image): `make e2e`, not `make test`; tests/traces
# a trace backend built for it: `make traces`; tests/alerts a Prometheus built for it: `make alerts`.
ASKED = (("e2e", "UNDOLOG_E2E"), ("traces", "UNDOLOG_TRACES"), ("alerts", "UNDOLOG_ALERTS"))
collect_ignore = [name for name, asked in ASKED if not os.environ.get(asked)]


@dataclass(frozen=True)
class Cluster:
    kubeconfig: Path
    local: LocalControlPlane | None

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        binary = BIN / "kubectl" if (BIN / "kubectl").exists() else Path("kubectl")
        return subprocess.run(
            [str(binary), f"--kubeconfig={self.kubeconfig}", *args],
            input=stdin,
            capture_output=True,
            text=True,
            check=check,
            timeout=120,
        )

    @property
    def env(self) -> dict[str, str]:
        """Environment for subprocesses (operator, CLI) that must reach this cluster."""
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig), "PATH": f"{BIN}:{os.environ['PATH']}"}


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if os.environ.get("KUBECONFIG"):
        target = Cluster(Path(os.environ["KUBECONFIG"]), None)
        install_crds(target)
        yield target
        return
    local = LocalControlPlane(tmp_path_factory.mktemp("control-plane"), BIN)
    endpoints = local.up()
    print(f"\nlocal control plane ready in {endpoints.started_in_seconds:.1f} s at {endpoints.server}")
    try:
        target = Cluster(endpoints.kubeconfig, local)
        install_crds(target)
        yield target
    finally:
        local.down()


def install_crds(target: Cluster) -> None:
    target.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
    target.kubectl("wait", "--for=condition=Established", "--timeout=60s", *CRDS)


@pytest_asyncio.fixture(scope="session")
async def kube(cluster: Cluster) -> AsyncIterator[Kube]:
    connection = await Kube.connect(str(cluster.kubeconfig))
    yield connection
    await connection.close()


@pytest_asyncio.fixture(scope="session")
async def session_loop() -> asyncio.AbstractEventLoop:
    """The loop `kube` and the other async fixtures run on, for a test that is not a coroutine:
    `asyncio.get_event_loop()` there answers according to whichever test ran before it."""
    return asyncio.get_running_loop()


@pytest_asyncio.fixture
async def namespace(kube: Kube) -> AsyncIterator[str]:
    """A fresh namespace per test, deleted afterwards (the namespace controller empties it)."""
    async with fresh_namespace(kube) as name:
        yield name


@pytest.fixture
def postgres(tmp_path: Path) -> Iterator[LocalPostgres]:
    """A PostgreSQL server of the test's own on loopback (Debian's package, an unprivileged user)."""
    server = LocalPostgres(tmp_path / "postgres").up()
    yield server
    server.down()


@pytest.fixture
def participant() -> Iterator[Participant]:
    """A real HTTP server on loopback that records what it receives."""
    server = Participant()
    yield server
    server.close()


@pytest.fixture
def operator(cluster: Cluster, namespace: str, tmp_path: Path) -> Iterator[OperatorProcess]:
    """`undolog operator` as a subprocess watching the test's namespace."""
    process = OperatorProcess(cluster.kubeconfig, namespace, tmp_path)
    process.start()
    yield process
    process.stop()


@dataclass(frozen=True)
class OwnCluster:
    """A control plane of a test's own (so restarting its processes disturbs no other test),
    with the CRDs, a namespace and a participant."""

    local: LocalControlPlane
    kubeconfig: Path
    kube: Kube
    namespace: str
    participant: Participant


@asynccontextmanager
async def own_control_plane(tmp_path: Path) -> AsyncIterator[OwnCluster]:
    local = LocalControlPlane(tmp_path / "control-plane", BIN)
    endpoints = local.up()
    try:
        install_crds(Cluster(endpoints.kubeconfig, local))
        kube = await Kube.connect(str(endpoints.kubeconfig))
        namespace = f"o-{uuid.uuid4().hex[:8]}"
        await kube.create_namespace(namespace, {})
        participant = Participant()
        try:
            yield OwnCluster(local, endpoints.kubeconfig, kube, namespace, participant)
        finally:
            participant.close()
            await kube.close()
    finally:
        local.down()
