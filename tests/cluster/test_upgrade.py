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
from tests.support.manifests import call, timestamp, webhook
from tests.support.operator_process import OperatorProcess
from tests.support.participants import Participant, Reply
from tests.support.waiting import eventually, saga_phase
from undolog import ledger
from undolog.conventions import STORED_AS_ANNOTATION
from undolog.inspect import Inspector
from undolog.kube import Body, Kube
from undolog.ledger import EntryStatusRoute
from undolog.sdk import Call as SdkCall
from undolog.sdk import SagaRun, open_saga

pytestmark = pytest.mark.cluster

PREVIOUS = "acfccfbd71c8552bd4db10279acee0c330f07074"  # chart 0.2.0: v1alpha1 served and stored alone
OLD = "undolog.io/v1alpha1"
MERGE = "application/merge-patch+json"


def previous_release(into: Path, commit: str = PREVIOUS) -> Path:
    """A previous release's operator and CRDs, from the repository's history."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", commit, "operator", "crds"],
        capture_output=True,
        check=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


class OldClient:
    """What an agent of a previous release writes: v1alpha1 objects (0.2.0), v1beta1 (0.3.0), the
    entries' status through /status."""

    def __init__(self, kube: Kube, namespace: str, api_version: str = OLD) -> None:
        self.kube, self.namespace, self.api_version = kube, namespace, api_version
        self.path = f"/apis/{api_version}/namespaces/{namespace}"

    async def create(self, plural: str, body: Body) -> Body:
        return await self.kube.request("POST", f"{self.path}/{plural}", {"apiVersion": self.api_version, **body})

    async def saga(self, name: str, *functions: str) -> None:
        """An external saga with one committed entry per function, positions 1..n."""
        created = await self.create("sagas", {"kind": "Saga", "metadata": {"name": name}, "spec": {}})
        owner = {"apiVersion": self.api_version, "kind": "Saga", "name": name, "uid": created["metadata"]["uid"]}
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


RELEASE_0_3_0 = "8b0731065961b1fa2cfad654a0f216f789d9a922"  # UndoEntry status through v1beta1's /status alone


async def sdk_saga(kube: Kube, namespace: str, name: str, steps: int) -> SagaRun:
    """A saga of this release's SDK with `steps` steps done (each Committed), left open."""
    run = await open_saga(name=name, namespace=namespace, kube=kube)
    for position in range(1, steps + 1):
        undo = SdkCall(function="undo", args={"saga": name, "position": position})
        async with run.step(f"step{position}", compensation=undo) as made:
            made.output = {"id": position}
    return run


async def entries_as_stored(kube: Kube, namespace: str, saga: str) -> list[Body]:
    """The saga's entries with their field owners (a raw LIST: the client trims them elsewhere)."""
    path = f"/apis/undolog.io/v1beta1/namespaces/{namespace}/undoentries"
    listed = await kube.request("GET", f"{path}?fieldSelector=spec.saga%3D{saga}")
    return list(listed["items"])


async def test_this_release_s_sdk_on_the_0_3_0_crds_and_operator_then_through_the_upgrade(
    upgrade: Upgrade, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Agents upgrade the SDK before the platform team upgrades the chart: the SDK records its
    steps through /status while v1beta2 is not served, the 0.3.0 operator compensates them; a
    saga open across the upgrade, and an agent still on 0.3.0 (its /status), are finished by
    this release's operator, every undo called once; entries it wrote keep no field owners."""
    kube, namespace, participant = upgrade.kube, upgrade.namespace, upgrade.participant
    monkeypatch.setattr("undolog.ledger.ENTRY_STATUS_ROUTE", EntryStatusRoute())  # this process's route, fresh
    previous = previous_release(tmp_path / "0.3.0", RELEASE_0_3_0)
    upgrade.install_crds(previous / "crds")
    await kube.create("webhooks", namespace, webhook("undo", url=participant.url("/undo")))
    environment = {"PYTHONPATH": str(previous / "operator")}
    operator = OperatorProcess(upgrade.cluster.kubeconfig, namespace, upgrade.logs, environment=environment)
    operator.start()
    try:
        early = await sdk_saga(kube, namespace, "early", 3)
        await early.abort("the agent gave up before the upgrade")
        assert ledger.ENTRY_STATUS_ROUTE.subresource  # v1beta2 answered 404: recorded through /status
        await saga_phase(kube, namespace, "early", "Compensated")
        across = await sdk_saga(kube, namespace, "across", 2)
    finally:
        operator.stop()

    upgrade.install_crds(REPO / "crds")  # helm upgrade: this release's CRDs, then its operator
    operator = OperatorProcess(upgrade.cluster.kubeconfig, namespace, upgrade.logs)
    operator.start()
    try:
        monkeypatch.setattr("undolog.ledger.RETRY_OBJECT_SECONDS", 0.0)  # the SDK's next try of the object, now
        undo = SdkCall(function="undo", args={"saga": "across", "position": 3})
        async with across.step("step3", compensation=undo) as made:
            made.output = {"id": 3}
        assert not ledger.ENTRY_STATUS_ROUTE.subresource
        await across.abort("the agent gave up after the upgrade")
        old = OldClient(kube, namespace, "undolog.io/v1beta1")  # an agent still on 0.3.0
        await old.saga("old-agent", "undo", "undo")
        await old.outcome("old-agent", "Abort")
        for name in ("across", "old-agent"):
            await saga_phase(kube, namespace, name, "Compensated")
    finally:
        operator.stop()
    undone = Counter((r.body["saga"], r.body["position"]) for r in participant.received("/undo") if r.replied == 200)
    assert undone == {
        (saga, p): 1 for saga, n in (("early", 3), ("across", 3), ("old-agent", 2)) for p in range(1, n + 1)
    }
    for entry in await entries_as_stored(kube, namespace, "across"):
        assert entry["status"]["state"] == "Compensated"
        assert not entry["metadata"].get("managedFields"), entry["metadata"]["name"]  # dropped by its outcome's write
