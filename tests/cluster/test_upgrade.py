"""An upgrade from the previous release (chart 0.2.0, undolog.io/v1alpha1 alone) on a control
plane of its own: its CRDs and its operator (its code, from git) with sagas Active,
Compensating, Halted and Completed, then this release's CRDs and operator. Every saga finishes
as it should, nothing is called twice beyond the key rule, `kubectl get sagas` reads the same
through both versions, and every object ends up stored as v1beta1."""

from __future__ import annotations

import base64
import io
import json
import subprocess
import tarfile
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
from devtools.control_plane import LocalControlPlane
from devtools.crds import CRDS

from tests.conftest import BIN, REPO, Cluster
from tests.support.manifests import call, timestamp
from tests.support.operator_process import OperatorProcess
from tests.support.participants import Participant, Reply
from tests.support.waiting import eventually, saga_phase
from undolog.conventions import STORED_AS_ANNOTATION
from undolog.inspect import Inspector
from undolog.kube import Body, Kube

pytestmark = pytest.mark.cluster

PREVIOUS = "acfccfbd71c8552bd4db10279acee0c330f07074"  # chart 0.2.0: v1alpha1 served and stored alone
OLD = "undolog.io/v1alpha1"
MERGE = "application/merge-patch+json"


def previous_release(into: Path) -> Path:
    """The previous release's operator and CRDs, from the repository's history."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", PREVIOUS, "operator", "crds"],
        capture_output=True,
        check=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


class OldClient:
    """What an agent of the previous release writes: v1alpha1 objects."""

    def __init__(self, kube: Kube, namespace: str) -> None:
        self.kube, self.namespace = kube, namespace
        self.path = f"/apis/{OLD}/namespaces/{namespace}"

    async def create(self, plural: str, body: Body) -> Body:
        return await self.kube.request("POST", f"{self.path}/{plural}", {"apiVersion": OLD, **body})

    async def saga(self, name: str, *functions: str) -> None:
        """An external saga with one committed entry per function, positions 1..n."""
        created = await self.create("sagas", {"kind": "Saga", "metadata": {"name": name}, "spec": {}})
        owner = {"apiVersion": OLD, "kind": "Saga", "name": name, "uid": created["metadata"]["uid"]}
        for position, function in enumerate(functions, start=1):
            spec = {
                "saga": name,
                "undoId": str(uuid.uuid4()),
                "stackPosition": position,
                "effectId": f"{created['metadata']['uid']}:step{position}:fwd",
                "step": f"step{position}",
                "compensation": call(function, saga=name, position=position),
                "registeredAt": timestamp(),
            }
            metadata = {"name": f"{name}-{position}", "ownerReferences": [{**owner, "blockOwnerDeletion": True}]}
            await self.create("undoentries", {"kind": "UndoEntry", "metadata": metadata, "spec": spec})
            status = {"status": {"effect": "Committed"}}
            path = f"{self.path}/undoentries/{name}-{position}/status"
            await self.kube.request("PATCH", path, status, content_type=MERGE)

    async def phase(self, name: str, phase: str) -> Body:
        async def saga() -> Body:
            return await self.kube.request("GET", f"{self.path}/sagas/{name}")

        def there(body: Body) -> bool:
            return bool(body.get("status", {}).get("phase") == phase)

        return await eventually(saga, there, 30, f"saga {name} {phase}")

    async def outcome(self, name: str, outcome: str) -> None:
        patch = {"spec": {"outcome": outcome}}
        await self.kube.request("PATCH", f"{self.path}/sagas/{name}", patch, content_type=MERGE)


def stored_versions(etcd: str, namespace: str) -> Counter[str]:
    """The apiVersion each of the namespace's objects is stored as, read from etcd itself."""
    found: Counter[str] = Counter()
    for plural in ("sagas", "undoentries", "webhooks"):
        prefix = f"/registry/undolog.io/{plural}/{namespace}/".encode()
        end = prefix[:-1] + bytes([prefix[-1] + 1])
        ranged = {"key": base64.b64encode(prefix).decode(), "range_end": base64.b64encode(end).decode()}
        answer = httpx.post(f"{etcd}/v3/kv/range", json=ranged, timeout=30).json()
        for kv in answer.get("kvs", []):
            found[json.loads(base64.b64decode(kv["value"]))["apiVersion"]] += 1
    return found


def phases(listing: str) -> dict[str, str]:
    rows = [line.split() for line in listing.strip().splitlines()[1:]]
    return {row[0]: row[1] for row in rows}


@dataclass
class Upgrade:
    """A control plane of its own with the previous release's CRDs, a namespace, a participant."""

    local: LocalControlPlane
    cluster: Cluster
    kube: Kube
    namespace: str
    participant: Participant
    logs: Path

    def install_crds(self, folder: Path) -> None:
        self.cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(folder))
        self.cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", *CRDS)


@pytest_asyncio.fixture
async def upgrade(tmp_path: Path) -> AsyncIterator[Upgrade]:
    local = LocalControlPlane(tmp_path / "control-plane", BIN)
    endpoints = local.up()
    participant = Participant()
    kube = await Kube.connect(str(endpoints.kubeconfig))
    try:
        namespace = f"u-{uuid.uuid4().hex[:8]}"
        await kube.create_namespace(namespace, {})
        cluster = Cluster(endpoints.kubeconfig, local)
        yield Upgrade(local, cluster, kube, namespace, participant, tmp_path / "logs")
    finally:
        participant.close()
        await kube.close()
        local.down()


async def the_previous_release_at_work(upgrade: Upgrade, previous: Path) -> None:
    """Its operator leaves sagas Active, Compensating (a call hanging), Halted and Completed."""
    upgrade.install_crds(previous / "crds")
    old, participant = OldClient(upgrade.kube, upgrade.namespace), upgrade.participant
    for function in ("undo", "slow", "refuse"):
        version = {"name": "v1", "url": participant.url(f"/{function}")}
        await old.create(
            "webhooks", {"kind": "Webhook", "metadata": {"name": function}, "spec": {"versions": [version]}}
        )
    participant.script("/slow", Reply(503, delay=30))  # hangs through the upgrade; its answer reaches no one
    participant.script("/refuse", Reply(400, {"error": "not yet"}))
    environment = {"PYTHONPATH": str(previous / "operator")}
    operator = OperatorProcess(upgrade.cluster.kubeconfig, upgrade.namespace, upgrade.logs, environment=environment)
    operator.start()
    try:
        for name, functions in {
            "active": ["undo"] * 2,
            "compensating": ["slow", "undo"],
            "halted": ["undo", "refuse"],
        }.items():
            await old.saga(name, *functions)
        await old.saga("done", "undo")
        for name, outcome in {"compensating": "Abort", "halted": "Abort", "done": "Commit"}.items():
            await old.outcome(name, outcome)
        await participant.until(lambda got: any(r.path == "/slow" for r in got))
        for name, phase in {
            "halted": "Halted",
            "done": "Completed",
            "compensating": "Compensating",
            "active": "Active",
        }.items():
            await old.phase(name, phase)
        listed = upgrade.cluster.kubectl("get", "sagas", "-n", upgrade.namespace).stdout
        print(f"\nkubectl get sagas, the previous release:\n{listed}")
    finally:
        operator.stop()


async def test_an_upgrade_from_the_previous_release_finishes_every_saga_and_calls_nothing_twice(
    upgrade: Upgrade, tmp_path: Path
) -> None:
    kube, namespace, participant = upgrade.kube, upgrade.namespace, upgrade.participant
    await the_previous_release_at_work(upgrade, previous_release(tmp_path / "previous"))
    assert set(stored_versions(upgrade.local.etcd_url, namespace)) == {OLD}

    upgrade.install_crds(REPO / "crds")
    operator = OperatorProcess(upgrade.cluster.kubeconfig, namespace, upgrade.logs)
    operator.start()
    try:
        inspector = Inspector(kube)
        await inspector.abort(namespace, "active", "the agent gave up after the upgrade")
        await saga_phase(kube, namespace, "active", "Compensated")
        await saga_phase(kube, namespace, "compensating", "Compensated", within=60)
        await inspector.retry(namespace, "halted", "the participant was fixed")
        await saga_phase(kube, namespace, "halted", "Compensated")
        stored = await eventually(
            lambda: _stored(upgrade.local.etcd_url, namespace),
            lambda versions: set(versions) == {"undolog.io/v1beta1"},
            60,
            "every object stored as v1beta1",
        )
        lease = await kube.get_lease(namespace, "undolog-operator")
        assert lease["metadata"]["annotations"][STORED_AS_ANNOTATION] == "v1beta1"
    finally:
        operator.stop()
    assert stored["undolog.io/v1beta1"] == 4 + 7 + 3  # sagas, entries, webhooks

    answered = Counter((r.path, r.body["saga"], r.body["position"]) for r in participant.received() if r.replied == 200)
    assert answered == {
        (path, saga, position): 1
        for path, saga, position in [
            ("/undo", "active", 1),
            ("/undo", "active", 2),
            ("/undo", "compensating", 2),
            ("/slow", "compensating", 1),
            ("/undo", "halted", 1),
            ("/refuse", "halted", 2),
        ]
    }
    for path in ("/slow", "/refuse"):  # asked again after the upgrade, with the same key
        assert len(participant.received(path)) == 2, participant.received(path)
        assert len({r.key for r in participant.received(path)}) == 1

    alpha = upgrade.cluster.kubectl("get", "sagas.v1alpha1.undolog.io", "-n", namespace)
    beta = upgrade.cluster.kubectl("get", "sagas.v1beta1.undolog.io", "-n", namespace)
    print(f"kubectl get sagas.v1alpha1.undolog.io:\n{alpha.stdout}{alpha.stderr}")
    print(f"kubectl get sagas.v1beta1.undolog.io:\n{beta.stdout}")
    assert "deprecated" in alpha.stderr
    expected = {"active": "Compensated", "compensating": "Compensated", "halted": "Compensated", "done": "Completed"}
    assert phases(alpha.stdout) == phases(beta.stdout) == expected


async def _stored(etcd: str, namespace: str) -> Counter[str]:
    return stored_versions(etcd, namespace)
