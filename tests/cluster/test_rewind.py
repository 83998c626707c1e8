"""Rewind (partial rollback) end to end: an agent rewinds through the SDK and goes on, a person
rewinds with the CLI while the operator is killed mid-rewind, and a rewind past a committed
Pivot is refused at admission."""

from __future__ import annotations

import pytest
import yaml

from tests.cluster.test_cli import undolog
from tests.cluster.test_compensation import external_saga, register
from tests.conftest import Cluster
from tests.support.manifests import call, saga, step, webhook
from tests.support.operator_process import OperatorProcess
from tests.support.participants import Participant, Reply
from tests.support.waiting import eventually, saga_phase
from undolog.kube import Kube
from undolog.sdk import Call, open_saga

pytestmark = pytest.mark.cluster


def undo_table(cluster: Cluster, namespace: str) -> str:
    columns = "NAME:.metadata.name,STEP:.spec.step,EFFECT:.status.effect,STATE:.status.state,REWOUND:.status.rewoundAt"
    return cluster.kubectl("get", "undo", "-n", namespace, "-o", f"custom-columns={columns}").stdout


async def test_an_agent_rewinds_three_of_five_steps_then_goes_on_and_commits(
    kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess, cluster: Cluster
) -> None:
    await register(kube, namespace, participant, "undo")
    run = await open_saga(name="plan", namespace=namespace, kubeconfig=str(cluster.kubeconfig))
    async with run:
        for n in range(1, 6):
            async with run.step(f"tool{n}", Call(function="undo", args={"n": n})):
                pass
        print("\nbefore the rewind:\n" + undo_table(cluster, namespace))
        rewound = await run.rewind_to("tool2", reason="the plan after tool2 was wrong")
        print("after `rewind_to('tool2')`:\n" + undo_table(cluster, namespace))
        assert rewound.status.rewind is not None
        assert (rewound.status.phase, rewound.status.rewind.undone) == ("Active", 3)
        assert [r.body["n"] for r in participant.received()] == [5, 4, 3]
        async with run.step("tool3", Call(function="undo", args={"n": 33})) as again:
            assert again.position == 6  # a new, higher position
    done = await saga_phase(kube, namespace, "plan", "Completed")
    assert done["status"]["rewind"]["state"] == "Done"
    entries = {e["spec"]["stackPosition"]: e for e in await kube.list("undoentries", namespace)}
    assert {p for p, e in entries.items() if e["status"].get("rewoundAt")} == {3, 4, 5}
    assert entries[6]["spec"]["step"] == "tool3-6"
    assert entries[6]["status"]["effect"] == "Committed"
    assert [r.body["n"] for r in participant.received()] == [5, 4, 3]  # nothing else undone at the commit


async def test_a_person_rewinds_and_the_operator_is_killed_mid_rewind(
    kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess, cluster: Cluster
) -> None:
    participant.script("/undo-4", Reply(200, delay=3.0))  # in flight when the operator dies
    await register(kube, namespace, participant, *(f"undo-{p}" for p in range(1, 6)))
    await external_saga(kube, namespace, "agent", [call(f"undo-{p}") for p in range(1, 6)])
    await saga_phase(kube, namespace, "agent", "Active")
    asked = undolog(cluster, "rewind", "agent", "-n", namespace, "--to", "2", "--reason", "INC-7: redo from step 2")
    assert asked.returncode == 0, asked.stderr
    await participant.until(lambda received: any(r.path == "/undo-4" for r in received))
    operator.kill()
    operator.start()
    back = await eventually(
        lambda: kube.get("sagas", namespace, "agent"),
        lambda s: s["status"].get("rewind", {}).get("state") == "Done",
        60,
        "the rewind done",
    )
    assert back["status"]["phase"] == "Active"
    assert "INC-7: redo from step 2 (by " in back["status"]["rewind"]["reason"]
    paths = [r.path for r in participant.received()]
    assert paths == ["/undo-5", "/undo-4", "/undo-4", "/undo-3"]  # the re-send under the same key
    assert len({r.key for r in participant.received("/undo-4")}) == 1
    states = {e["spec"]["stackPosition"]: e["status"]["state"] for e in await kube.list("undoentries", namespace)}
    assert states == {1: "Pending", 2: "Pending", 3: "Compensated", 4: "Compensated", 5: "Compensated"}
    described = cluster.kubectl("describe", "saga", "agent", "-n", namespace).stdout
    assert "Rewinding" in described
    assert "rewound to position 2: 3 entries undone" in described


async def test_a_rewind_past_a_committed_pivot_is_refused_at_admission(
    kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess, cluster: Cluster
) -> None:
    steps = [step("reserve"), step("pay", "Pivot"), step("ship", "Retriable")]
    for function in ("reserve-do", "reserve-undo", "pay-do", "ship-do"):
        await kube.create("webhooks", namespace, webhook(function, url=participant.url(f"/{function}")))
    await kube.create("sagas", namespace, saga("order", steps))
    await saga_phase(kube, namespace, "order", "Completed")
    patch = yaml.safe_dump({"spec": {"rewind": {"toPosition": 1, "reason": "undo the payment"}}})
    refused = cluster.kubectl("patch", "saga", "order", "-n", namespace, "--type=merge", "-p", patch, check=False)
    assert refused.returncode != 0
    assert 'it would undo the committed Pivot step "pay"; rewind to its position or above' in refused.stderr
    assert "/reserve-undo" not in [r.path for r in participant.received()]
