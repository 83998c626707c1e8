"""Where the operator may call: loopback, its own ports and denied ranges are refused on the
address actually connected to (a name that resolves to loopback too), nothing is sent, and the
entry says why. All traffic here stays on loopback: the refusal of loopback is configured."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cluster.test_compensation import abort, external_saga
from tests.conftest import Cluster
from tests.support.manifests import call, webhook
from tests.support.operator_process import OperatorProcess
from tests.support.participants import Participant
from tests.support.waiting import saga_phase
from undolog.kube import Kube

pytestmark = pytest.mark.cluster


async def halted_on(kube: Kube, namespace: str, name: str, url: str) -> dict[str, str]:
    """A saga whose only compensation calls `url`; returns its entry's status once Halted."""
    await kube.create("webhooks", namespace, webhook(f"{name}-undo", url=url))
    await external_saga(kube, namespace, name, [call(f"{name}-undo")])
    await abort(kube, namespace, name)
    halted = await saga_phase(kube, namespace, name, "Halted")
    assert "refused by the operator's egress policy" in halted["status"]["message"]
    entry = await kube.get("undoentries", namespace, f"{name}-1")
    status: dict[str, str] = entry["status"]
    return status


async def test_loopback_is_refused_by_default_even_behind_a_name(
    kube: Kube, namespace: str, participant: Participant, cluster: Cluster, tmp_path: Path
) -> None:
    operator = OperatorProcess(cluster.kubeconfig, namespace, tmp_path, allow_loopback=False)
    operator.start()
    try:
        by_address = await halted_on(kube, namespace, "direct", participant.url("/undo"))
        by_name = await halted_on(kube, namespace, "named", f"http://localhost:{participant.port}/undo")
    finally:
        operator.stop()
    for status in (by_address, by_name):
        assert status["state"] == "Failed"
        assert status["reason"] == "TargetRefused"
        assert "(denied: 127.0.0.0/8)" in status["lastError"]
        assert len(status["attempts"]) == 1  # refused is permanent: not retried
    assert participant.received() == []  # not one request arrived


async def test_the_operators_own_ports_and_denied_ranges_are_refused_when_loopback_is_allowed(
    kube: Kube, namespace: str, participant: Participant, cluster: Cluster, tmp_path: Path
) -> None:
    denied = Participant()
    operator = OperatorProcess(
        cluster.kubeconfig, namespace, tmp_path, extra_args=("--verbose", f"--egress-deny=127.0.0.1/32:{denied.port}")
    )
    operator.start()
    try:
        own = await halted_on(kube, namespace, "own", f"http://127.0.0.1:{operator.metrics_port}/metrics")
        assert own["reason"] == "TargetRefused"
        assert f"127.0.0.1:{operator.metrics_port} is refused" in own["lastError"]
        port = await halted_on(kube, namespace, "port", denied.url("/undo"))
        assert port["reason"] == "TargetRefused"
        assert denied.received() == []
        # Another port of loopback is allowed here (the tests' participants live there).
        await kube.create("webhooks", namespace, webhook("fine-undo", url=participant.url("/undo")))
        await external_saga(kube, namespace, "fine", [call("fine-undo")])
        await abort(kube, namespace, "fine")
        await saga_phase(kube, namespace, "fine", "Compensated")
        assert [r.path for r in participant.received()] == ["/undo"]
    finally:
        operator.stop()
        denied.close()


async def test_a_service_target_in_another_namespace_is_refused(
    kube: Kube, namespace: str, participant: Participant, cluster: Cluster, tmp_path: Path
) -> None:
    operator = OperatorProcess(cluster.kubeconfig, namespace, tmp_path)
    operator.start()
    try:
        hook = webhook("elsewhere-undo")
        hook["spec"]["versions"] = [{"name": "v1", "service": {"namespace": "kube-system", "name": "metrics"}}]
        await kube.create("webhooks", namespace, hook)
        await external_saga(kube, namespace, "elsewhere", [call("elsewhere-undo")])
        await abort(kube, namespace, "elsewhere")
        halted = await saga_phase(kube, namespace, "elsewhere", "Halted")
    finally:
        operator.stop()
    assert "names Service kube-system/metrics, outside the Webhook's namespace" in halted["status"]["message"]
    assert "--allow-cross-namespace-services" in halted["status"]["message"]
