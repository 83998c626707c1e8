"""Guarded compensations end to end: the operator as a process, real participants on loopback.
A step says what it left; before its undo the operator reads the state again, and a later change
there halts the entry as Conflict (the compensation never sent) for a person to decide."""

from __future__ import annotations

from typing import Any

import pytest

from tests.cluster.test_compensation import register
from tests.conftest import Cluster
from tests.support.operator_process import OperatorProcess
from tests.support.participants import Participant, Received, Reply
from tests.support.waiting import saga_phase
from undolog.api import Call, Guard
from undolog.inspect import Inspector
from undolog.kube import Kube
from undolog.sdk import open_saga

pytestmark = pytest.mark.cluster


class Counter:
    """A participant's state: replicas per deployment, changed by steps, undos and a second writer."""

    def __init__(self, participant: Participant) -> None:
        self.replicas = {"web": 2, "api": 2}
        participant.handle(
            "/read", lambda r: Reply(200, {"name": r.body["name"], "replicas": self.replicas[r.body["name"]]})
        )
        participant.handle("/scale", self.scale)

    def scale(self, request: Received) -> Reply:
        self.replicas[request.body["name"]] = request.body["replicas"]
        return Reply(200, {})


async def scaled(cluster: Cluster, namespace: str, counter: Counter, name: str, to: int) -> str:
    """An agent's saga that scales `name` to `to`, guarded, and aborts; its name."""
    saga = await open_saga(generate_name="agent-", namespace=namespace, kubeconfig=str(cluster.kubeconfig))
    before = counter.replicas[name]
    guard = Guard(read=Call(function="read", args={"name": name}), holds="state.replicas", before=before)
    async with saga.step(
        f"scale-{name}", Call(function="scale", args={"name": name, "replicas": before}), guard=guard
    ) as run:
        counter.replicas[name] = to  # the step's effect
        run.leaves(to)
    await saga.abort("the agent gave up")
    await saga.close()
    return saga.name


async def test_a_later_change_halts_the_undo_as_conflict_and_a_person_decides(
    kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess, cluster: Cluster
) -> None:
    await register(kube, namespace, participant, "read", "scale")
    counter = Counter(participant)
    # Nobody touched api after the agent: its undo goes through (one read, then the undo).
    untouched = await scaled(cluster, namespace, counter, "api", 5)
    await saga_phase(kube, namespace, untouched, "Compensated")
    assert counter.replicas["api"] == 2

    # A second writer scales web to 10 after the agent scaled it to 5: the undo is not sent.
    name = await scaled(cluster, namespace, counter, "web", 5)
    undos_before = len(participant.received("/scale"))
    counter.replicas["web"] = 10
    halted = await saga_phase(kube, namespace, name, "Halted")
    assert halted["status"]["reason"] == "Conflict"
    assert "undolog undo-anyway" in halted["status"]["message"]
    assert counter.replicas["web"] == 10  # the later change is kept
    assert len(participant.received("/scale")) == undos_before
    entry = await kube.get("undoentries", namespace, f"{name}-1")
    assert (entry["status"]["state"], entry["status"]["reason"]) == ("Failed", "Conflict")
    seen: dict[str, Any] = entry["status"]["guard"]
    assert (entry["spec"]["guard"]["before"], seen["after"], seen["now"]) == (2, 5, 10)
    assert "Guard" in {a["kind"] for a in entry["status"]["attempts"]}
    shown = await Inspector(kube).show(namespace, name)
    assert shown.entries[0].status.guard is not None

    # Mend by hand to what the step left, then retry: the guard holds, the undo goes.
    counter.replicas["web"] = 5
    await Inspector(kube).retry(namespace, name, "set back to 5 by hand")
    await saga_phase(kube, namespace, name, "Compensated")
    assert counter.replicas["web"] == 2


async def test_undo_anyway_overwrites_the_later_change_and_says_so(
    kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess, cluster: Cluster
) -> None:
    await register(kube, namespace, participant, "read", "scale")
    counter = Counter(participant)
    name = await scaled(cluster, namespace, counter, "web", 5)
    counter.replicas["web"] = 10
    await saga_phase(kube, namespace, name, "Halted")
    await Inspector(kube).undo_anyway(namespace, name, 1, "the autoscaler's 10 was a mistake")
    await saga_phase(kube, namespace, name, "Compensated")
    assert counter.replicas["web"] == 2
    entry = await kube.get("undoentries", namespace, f"{name}-1")
    assert entry["status"]["guard"]["overridden"].startswith("the autoscaler's 10 was a mistake (by ")
    assert "undolog.io/undo-anyway" not in entry["metadata"].get("annotations", {})


async def test_a_participant_that_answers_409_naming_a_conflict_halts_it_unretried(
    kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess, cluster: Cluster
) -> None:
    await register(kube, namespace, participant, "refund")
    participant.handle("/refund", lambda r: Reply(409, {"conflict": "the charge was disputed since: refund by hand"}))
    saga = await open_saga(generate_name="agent-", namespace=namespace, kubeconfig=str(cluster.kubeconfig))
    async with saga.step("charge", Call(function="refund", args={"charge": "ch_1"})):
        pass
    await saga.abort("the agent gave up")
    await saga.close()
    halted = await saga_phase(kube, namespace, saga.name, "Halted")
    assert halted["status"]["reason"] == "Conflict"
    entry = await kube.get("undoentries", namespace, f"{saga.name}-1")
    assert entry["status"]["reason"] == "Conflict"
    assert "the charge was disputed since" in entry["status"]["lastError"]
    assert len(participant.received("/refund")) == 1  # a conflict is not retried


async def test_a_guard_whose_holds_does_not_compile_halts_saying_so_without_a_read(
    kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess, cluster: Cluster
) -> None:
    """The SDK does not compile CEL (it installs lean): a `holds` with a syntax error reaches
    the operator, which says so instead of calling what the step left gone."""
    await register(kube, namespace, participant, "read", "scale")
    saga = await open_saga(generate_name="agent-", namespace=namespace, kubeconfig=str(cluster.kubeconfig))
    guard = Guard(read=Call(function="read", args={"name": "web"}), holds="state.replicas ==")
    async with saga.step("scale-web", Call(function="scale", args={"name": "web", "replicas": 2}), guard=guard) as run:
        run.leaves(5)
    await saga.abort("the agent gave up")
    await saga.close()
    await saga_phase(kube, namespace, saga.name, "Halted")
    entry = await kube.get("undoentries", namespace, f"{saga.name}-1")
    assert entry["status"]["reason"] == "Conflict"
    assert "spec.guard.holds does not compile" in entry["status"]["lastError"]
    assert participant.received("/read") == []  # nothing read: nothing it could be compared with
