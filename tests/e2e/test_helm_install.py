"""`helm install` for real: the chart with the image built by `make image`, its pods run by a
kubelet, the onboarding saga compensated by them, a forced leader deletion, an upgrade and an
uninstall. The tests run in order and share the release (as a platform team's day would)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml
from devtools.control_plane.node import NODE_NAME
from examples.onboarding import in_cluster

from tests.conftest import BIN, REPO, Cluster
from tests.support.identities import lease_holder
from tests.support.waiting import eventually
from undolog.kube import Kube
from undolog.version import __version__

RELEASE, RELEASE_NAMESPACE, SHOP = "undolog", "undolog-system", "onboarding"
# The chart as a release publishes it (make dist: helm package, linted); make e2e builds it first.
CHART = REPO / "dist" / f"undolog-{__version__}.tgz"
ONBOARDING = REPO / "examples" / "onboarding"
LEASE = "undolog-operator"
LEASE_SECONDS = 15  # the chart's default: a user's first install
TIMINGS: dict[str, float] = {}


@dataclass
class Release:
    cluster: Cluster
    sagas: list[str] = field(default_factory=list)

    def kubectl(self, *args: str, check: bool = True) -> str:
        done = self.cluster.kubectl(*args, check=False)
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {done.stderr}")
        return done.stdout

    def json(self, *args: str) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json"))

    def helm(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / "helm"), f"--kubeconfig={self.cluster.kubeconfig}", *args],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )

    def operator_pods(self) -> list[dict[str, Any]]:
        pods = self.json("get", "pods", "-n", RELEASE_NAMESPACE, "-l", "app.kubernetes.io/name=undolog")["items"]
        return [p for p in pods if not p["metadata"].get("deletionTimestamp")]

    def apply_saga(self, name: str) -> None:
        """The onboarding saga under another name, applied as a user would: kubectl apply."""
        manifest = yaml.safe_load((ONBOARDING / "saga.yaml").read_text())
        manifest["metadata"]["name"] = name
        done = self.cluster.kubectl("apply", "-n", SHOP, "-f", "-", stdin=yaml.safe_dump(manifest), check=False)
        assert done.returncode == 0, done.stderr
        self.sagas.append(name)

    def services_state(self) -> dict[str, Any]:
        return in_cluster.services_state(self.kubectl, SHOP)


def ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions", [])
    return pod["status"].get("phase") == "Running" and any(
        c["type"] == "Ready" and c["status"] == "True" for c in conditions
    )


async def holder(kube: Kube) -> str:
    return await lease_holder(kube, RELEASE_NAMESPACE, LEASE)


async def phases(kube: Kube, names: list[str]) -> dict[str, str]:
    return {name: (await kube.get("sagas", SHOP, name)).get("status", {}).get("phase", "") for name in names}


def all_in(*terminal: str) -> Any:
    return lambda seen: all(value in terminal for value in seen.values())


async def consistent_with_the_services(release: Release, node_kube: Kube) -> dict[str, str]:
    """Whatever a saga ended in, the services agree: a Completed saga left its user, roles and
    email; a Compensated one left nothing but a recalled email; no effect was doubled (every
    call after the first with a key was a replay: one user per saga at most)."""
    ended = await phases(node_kube, release.sagas)
    state = release.services_state()
    completed = sum(1 for phase in ended.values() if phase == "Completed")
    compensated = sum(1 for phase in ended.values() if phase == "Compensated")
    assert completed + compensated == len(release.sagas), ended
    assert len(state["identity"]["users"]) == completed, (ended, state)
    assert len(state["authorization"]["permissions"]) == completed, (ended, state)
    assert len(state["email"]["recalled"]) == compensated, (ended, state)
    assert len(state["email"]["delivered"]) == completed, (ended, state)
    created = [c for c in state["identity"]["calls"] if c.startswith("/users ->")]
    assert len(created) == len(release.sagas), state["identity"]["calls"]
    return ended


@pytest.fixture(scope="module")
def release(node_cluster: Cluster) -> Iterator[Release]:
    yield Release(node_cluster)
    print("\ne2e timings (s): " + ", ".join(f"{k} {v:.1f}" for k, v in TIMINGS.items()))


async def test_helm_install_on_crds_applied_with_kubectl_runs_two_ready_pods_and_one_leads(
    release: Release, node_kube: Kube
) -> None:
    assert CHART.is_file(), f"{CHART} is missing: make dist packages the chart (make e2e runs it first)"
    # What `make demo` and the README's quick start leave behind: CRDs applied without Helm.
    release.kubectl("apply", "--server-side", "-f", str(REPO / "crds"))
    begin = time.monotonic()
    installed = release.helm(
        "install", RELEASE, str(CHART), "-n", RELEASE_NAMESPACE, "--create-namespace",
        "--take-ownership", "--wait", "--timeout=3m",
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    assert "make image" in installed.stdout  # NOTES: where the image comes from
    TIMINGS["install to 2 Ready"] = time.monotonic() - begin
    pods = release.operator_pods()
    assert len(pods) == 2, pods
    assert all(ready(p) and p["spec"]["nodeName"] == NODE_NAME for p in pods), pods
    print(release.kubectl("get", "pods", "-n", RELEASE_NAMESPACE, "-o", "wide"))
    image_ids = {s["imageID"] for p in pods for s in p["status"]["containerStatuses"]}
    print(f"image: {pods[0]['spec']['containers'][0]['image']} {image_ids}")
    assert len(image_ids) == 1
    assert next(iter(image_ids)).startswith("sha256:")
    names = {p["metadata"]["name"] for p in pods}
    leader = await eventually(lambda: holder(node_kube), lambda h: h in names, 60, "a pod holding the Lease")
    print(f"leader: {leader}")

    # The chart's securityContext, as the kubelet applied it.
    pod = pods[0]["metadata"]["name"]
    assert release.kubectl("exec", "-n", RELEASE_NAMESPACE, pod, "--", "id", "-u").strip() == "65532"
    wrote = release.cluster.kubectl("exec", "-n", RELEASE_NAMESPACE, pod, "--", "touch", "/opt/x", check=False)
    assert wrote.returncode != 0
    assert "Read-only file system" in wrote.stderr


async def test_a_saga_applied_with_kubectl_is_compensated_by_the_pods(release: Release, node_kube: Kube) -> None:
    release.kubectl("create", "namespace", SHOP)
    address = await asyncio.to_thread(in_cluster.deploy_services, release.kubectl, SHOP)
    done = release.cluster.kubectl("apply", "-n", SHOP, "-f", "-", stdin=in_cluster.webhooks(address), check=False)
    assert done.returncode == 0, done.stderr

    begin = time.monotonic()
    release.apply_saga("onboard-ada")
    # The email provider answers after 5 s, the step waits 2 s: the pod undoes the saga, LIFO
    # (identity refuses to delete a user who still has permissions).
    await eventually(lambda: phases(node_kube, ["onboard-ada"]), all_in("Compensated"), 90, "onboard-ada Compensated")
    await consistent_with_the_services(release, node_kube)
    TIMINGS["saga compensated by the pod"] = time.monotonic() - begin
    state = release.services_state()
    assert state["email"]["recalled"] == ["ada@example.com"]
    assert state["identity"]["calls"] == ["/users -> 200", "/users/delete -> 200"]  # after the revoke
    assert state["authorization"]["calls"] == ["/permissions/assign -> 200", "/permissions/revoke -> 200"]

    leader = await holder(node_kube)
    logs = release.kubectl("logs", "-n", RELEASE_NAMESPACE, leader)
    print(
        f"kubectl logs {leader} (the saga):\n" + "\n".join(line for line in logs.splitlines() if "onboard-ada" in line)
    )
    assert "onboard-ada" in logs
    # The liveness probe has run (10 s delay, every 10 s) and never failed.
    pods = release.operator_pods()
    started = min(time.mktime(time.strptime(p["status"]["startTime"], "%Y-%m-%dT%H:%M:%SZ")) for p in pods)
    await asyncio.sleep(max(0.0, started + 21 - time.mktime(time.gmtime())))
    pods = release.operator_pods()
    assert all(s["restartCount"] == 0 for p in pods for s in p["status"]["containerStatuses"])
    events = release.json("get", "events", "-n", RELEASE_NAMESPACE)["items"]
    failing = [
        f"{e['involvedObject'].get('name')}: {e['reason']} x{e.get('count')} since {e.get('firstTimestamp')}: "
        f"{e['message']}"
        for e in events
        if e["reason"] in ("Unhealthy", "BackOff")
    ]
    assert not failing, failing


async def test_the_standby_takes_over_a_forcibly_deleted_leader_and_finishes_the_work(
    release: Release, node_kube: Kube
) -> None:
    names = [f"onboard-{i}" for i in range(5)]
    for name in names:
        release.apply_saga(name)
    leader = await holder(node_kube)
    # Kill the leader while those sagas are in flight (their emails take 5 s).
    await eventually(lambda: phases(node_kube, names), lambda s: all(s.values()), 30, "the sagas picked up")
    begin = time.monotonic()
    release.kubectl("delete", "pod", "-n", RELEASE_NAMESPACE, leader, "--grace-period=0", "--force")
    standby = {p["metadata"]["name"] for p in release.operator_pods()} - {leader}
    taken = await eventually(lambda: holder(node_kube), lambda h: h in standby, 2 * LEASE_SECONDS + 10, "hand-over")
    TIMINGS["forced leader deletion to hand-over"] = time.monotonic() - begin
    print(f"{leader} deleted; {taken} leads after {TIMINGS['forced leader deletion to hand-over']:.1f} s")
    # Within the Lease: it expires 15 s after the dead leader's last renewal, and the standby
    # looks every 2 s (the retry period), so at most about 15 + 2 s, plus scheduling on 2 cores.
    assert TIMINGS["forced leader deletion to hand-over"] <= LEASE_SECONDS + 5
    # A send cut off by the kill is retried with its key by the new leader: the provider answers
    # at once from its record, so such a saga completes; one whose wait ran out is undone.
    await eventually(lambda: phases(node_kube, names), all_in("Completed", "Compensated"), 120, "every saga ended")
    TIMINGS["forced deletion to all 5 sagas ended"] = time.monotonic() - begin
    print(f"after the hand-over: {await consistent_with_the_services(release, node_kube)}")
    # The Deployment replaced the deleted pod: two Ready again.
    await eventually(
        lambda: asyncio.to_thread(release.operator_pods), lambda p: len(p) == 2 and all(map(ready, p)), 120, "2 Ready"
    )


async def test_helm_upgrade_rolls_the_pods_and_sagas_in_flight_finish(release: Release, node_kube: Kube) -> None:
    before = {p["metadata"]["name"] for p in release.operator_pods()}
    names = [f"upgrade-{i}" for i in range(3)]
    for name in names:
        release.apply_saga(name)
    begin = time.monotonic()
    upgraded = release.helm(
        "upgrade", RELEASE, str(CHART), "-n", RELEASE_NAMESPACE, "--reuse-values", "--set", "logFormat=plain",
        "--wait", "--timeout=3m",
    )  # fmt: skip
    assert upgraded.returncode == 0, upgraded.stderr
    TIMINGS["upgrade rolled"] = time.monotonic() - begin
    pods = await eventually(
        lambda: asyncio.to_thread(release.operator_pods),
        lambda p: len(p) == 2 and all(map(ready, p)) and not ({x["metadata"]["name"] for x in p} & before),
        120,
        "two new Ready pods",
    )
    assert all("--log-format=plain" in p["spec"]["containers"][0]["args"] for p in pods)
    await eventually(lambda: phases(node_kube, names), all_in("Completed", "Compensated"), 120, "upgrade sagas ended")
    TIMINGS["upgrade to its sagas ended"] = time.monotonic() - begin
    print(f"after the upgrade: {await consistent_with_the_services(release, node_kube)}")


async def test_helm_uninstall_keeps_the_crds_and_every_saga(release: Release, node_kube: Kube) -> None:
    uninstalled = release.helm("uninstall", RELEASE, "-n", RELEASE_NAMESPACE, "--wait")
    assert uninstalled.returncode == 0, uninstalled.stderr
    await eventually(lambda: asyncio.to_thread(release.operator_pods), lambda p: p == [], 120, "operator pods gone")
    crds = {c["metadata"]["name"] for c in release.json("get", "crds")["items"]}
    assert {"sagas.undolog.io", "undoentries.undolog.io", "webhooks.undolog.io"} <= crds
    kept = {s["metadata"]["name"]: s["status"]["phase"] for s in release.json("get", "sagas", "-n", SHOP)["items"]}
    assert kept == await phases(node_kube, release.sagas)
    assert set(kept) == set(release.sagas)
