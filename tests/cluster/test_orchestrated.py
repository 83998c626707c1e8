"""Orchestrated sagas end to end: the operator runs the forward calls itself, write-ahead,
with pivot order, forward recovery and post-commit effects."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.conftest import REPO, Cluster
from tests.support.manifests import saga, webhook
from tests.support.operator_process import OperatorProcess
from tests.support.participants import Participant, Received, Reply
from tests.support.waiting import eventually, saga_phase
from undolog.errors import KubeError
from undolog.kube import Kube

pytestmark = pytest.mark.cluster


def step(name: str, type_: str = "Compensatable", **args: Any) -> dict[str, Any]:
    function = name.replace("_", "-")
    body: dict[str, Any] = {"name": name, "type": type_, "action": {"function": f"{function}-do", "args": args}}
    if type_ == "Compensatable":
        body["compensation"] = {"function": f"{function}-undo", "args": {"of": name}}
    return body


async def register_steps(kube: Kube, namespace: str, participant: Participant, steps: list[dict[str, Any]]) -> None:
    functions = {s["action"]["function"] for s in steps} | {
        s["compensation"]["function"] for s in steps if "compensation" in s
    }
    for function in sorted(functions):
        await kube.create("webhooks", namespace, webhook(function, url=participant.url(f"/{function}")))


def paths(participant: Participant) -> list[str]:
    return [r.path.lstrip("/") for r in participant.received()]


async def entries_of(kube: Kube, namespace: str, name: str) -> dict[int, dict[str, Any]]:
    listed = await kube.list("undoentries", namespace, field_selector=f"spec.saga={name}")
    return {e["spec"]["stackPosition"]: e for e in listed}


async def test_steps_run_in_order_with_outputs_flowing(
    kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess
) -> None:
    participant.script("/create-user-do", Reply(200, {"user_id": "u-7", "profile": {"tier": "gold"}}))
    steps = [
        step("create_user", email="ada@example.com"),
        step(
            "assign", user="${steps.create_user.output.user_id}", note="tier ${steps.create_user.output.profile.tier}"
        ),
        step("notify", "Retriable", user="${steps.create_user.output.user_id}"),
    ]
    await register_steps(kube, namespace, participant, steps)
    created = await kube.create("sagas", namespace, saga("flow", steps))
    done = await saga_phase(kube, namespace, "flow", "Completed")
    uid = created["metadata"]["uid"]
    assert paths(participant) == ["create-user-do", "assign-do", "notify-do"]
    first, second, third = participant.received()
    assert second.body == {"user": "u-7", "note": "tier gold"}
    assert third.body == {"user": "u-7"}
    for request, name in zip((first, second, third), ("create_user", "assign", "notify"), strict=True):
        assert request.key == f"{uid}:{name}:fwd"
        assert request.headers["undolog-step"] == name
        assert request.headers["undolog-attempt"] == "1"
    entries = await entries_of(kube, namespace, "flow")
    assert [entries[p]["status"]["effect"] for p in (1, 2, 3)] == ["Committed"] * 3
    assert entries[1]["status"]["output"] == {"user_id": "u-7", "profile": {"tier": "gold"}}
    for position in (1, 2, 3):
        assert entries[position]["spec"]["registeredAt"] < entries[position]["status"]["executedAt"]
    assert done["status"]["stackDepth"] == 3
    assert done["metadata"]["labels"]["undolog.io/phase"] == "completed"


@pytest.mark.parametrize("failing", [1, 2, 3, 4])
async def test_a_failure_at_step_k_undoes_steps_k_to_1_newest_first(
    kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess, failing: int
) -> None:
    steps = [step(f"s{i}") for i in range(1, 5)]
    participant.script(f"/s{failing}-do", Reply(400, {"error": "refused"}))
    await register_steps(kube, namespace, participant, steps)
    await kube.create("sagas", namespace, saga("k", steps))
    done = await saga_phase(kube, namespace, "k", "Compensated")
    forward = [f"s{i}-do" for i in range(1, failing + 1)]
    undone = [f"s{i}-undo" for i in range(failing, 0, -1)]  # the failed step itself included
    assert paths(participant) == forward + undone
    assert done["status"]["failedStep"] == f"s{failing}"
    assert done["status"]["stackDepth"] == failing
    succeeded = next(c for c in done["status"]["conditions"] if c["type"] == "Succeeded")
    assert succeeded["reason"] == "StepFailed"
    assert f"step 's{failing}' failed: HTTP 400" in succeeded["message"]
    entries = await entries_of(kube, namespace, "k")
    assert entries[failing]["status"]["effect"] == "Failed"
    assert {entries[p]["status"]["state"] for p in entries} == {"Compensated"}


async def test_pivot_then_retriable_recovers_forward(
    kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess
) -> None:
    steps = [step("reserve"), step("capture", "Pivot"), step("confirm", "Retriable")]
    participant.script("/confirm-do", Reply(503), Reply(503), Reply(200, {"sent": True}))
    await register_steps(kube, namespace, participant, steps)
    await kube.create("sagas", namespace, saga("pivot", steps))
    done = await saga_phase(kube, namespace, "pivot", "Completed")
    assert paths(participant) == ["reserve-do", "capture-do", "confirm-do", "confirm-do", "confirm-do"]
    confirms = participant.received("/confirm-do")
    assert len({r.key for r in confirms}) == 1
    assert [r.headers["undolog-attempt"] for r in confirms] == ["1", "2", "3"]
    assert done["status"]["pivotCommitted"] is True


async def test_forward_recovery_exhausted_halts_and_never_compensates(
    kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess
) -> None:
    confirm = step("confirm", "Retriable")
    confirm["action"]["maxRetries"] = 2
    steps = [step("reserve"), step("capture", "Pivot"), confirm]
    participant.script("/confirm-do", *[Reply(503)] * 3)
    await register_steps(kube, namespace, participant, steps)
    await kube.create("sagas", namespace, saga("stuck", steps))
    halted = await saga_phase(kube, namespace, "stuck", "Halted")
    assert halted["status"]["reason"] == "ForwardRecoveryExhausted"
    assert halted["status"]["failedStep"] == "confirm"
    assert "nothing is compensated" in halted["status"]["message"]
    assert not [p for p in paths(participant) if p.endswith("-undo")]
    # Abort after the pivot is refused at admission.
    with pytest.raises(KubeError) as refused:
        await kube.patch("sagas", namespace, "stuck", {"spec": {"outcome": "Abort"}})
    assert "spec.outcome Abort is refused: the saga's Pivot step has committed" in refused.value.message
    # The participant recovers (its script is used up); a person retries: forward it goes.
    await kube.patch("sagas", namespace, "stuck", {"metadata": {"annotations": {"undolog.io/retry": "mailer back"}}})
    await saga_phase(kube, namespace, "stuck", "Completed")
    assert paths(participant)[-1] == "confirm-do"
    assert len(participant.received("/confirm-do")) == 4


async def test_post_commit_effects_are_sent_once_after_commit_and_never_after_abort(
    kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess
) -> None:
    participant.script("/reserve-do", Reply(200, {"reservation": "r-9"}))
    steps = [step("reserve")]
    await register_steps(kube, namespace, participant, steps)
    await kube.create("webhooks", namespace, webhook("mailer", url=participant.url("/mailer")))
    effects = [
        {
            "name": "thanks",
            "call": {"function": "mailer", "args": {"reservation": "${steps.reserve.output.reservation}"}},
        }
    ]
    committed = await kube.create("sagas", namespace, saga("good", steps, effects=effects))
    done = await eventually(
        lambda: kube.get("sagas", namespace, "good"),
        lambda s: (
            any(e.get("state") == "Delivered" for e in s.get("status", {}).get("effects", []))
            and not s["metadata"].get("finalizers")
        ),
        30,
        "effect delivered, then the finalizer released",
    )
    assert done["status"]["phase"] == "Completed"
    mails = participant.received("/mailer")
    assert len(mails) == 1
    assert mails[0].key == f"{committed['metadata']['uid']}:effect:thanks"
    assert mails[0].body == {"reservation": "r-9"}
    # The effect went out after the saga was Completed, never before.
    reserve = participant.received("/reserve-do")[0]
    assert mails[0].at > reserve.at

    participant.script("/reserve-do", Reply(422, {"error": "out of stock"}))  # permanent: 409 is retried
    await kube.create("sagas", namespace, saga("bad", steps, effects=effects))
    await saga_phase(kube, namespace, "bad", "Compensated")
    assert len(participant.received("/mailer")) == 1  # nothing for the aborted saga


async def test_a_step_never_sent_is_not_undone_with_null_arguments(
    kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess
) -> None:
    steps = [step("reserve"), step("create_user")]
    steps[1]["compensation"]["args"] = {"user_id": "${steps.create_user.output.user_id}"}
    await register_steps(kube, namespace, participant, steps)
    await kube.delete("webhooks", namespace, "create-user-do")  # unregistered: refused before any byte left
    await kube.create("sagas", namespace, saga("never", steps))
    done = await saga_phase(kube, namespace, "never", "Compensated")
    assert paths(participant) == ["reserve-do", "reserve-undo"]  # never DELETE {"user_id": null}
    assert done["status"]["failedStep"] == "create_user"
    entries = await entries_of(kube, namespace, "never")
    never = entries[2]["status"]
    assert (never["effect"], never["state"], never["reason"]) == ("NotSent", "Skipped", "NotSent")
    assert "no Webhook 'create-user-do'" in never["skipReason"]
    assert entries[1]["status"]["state"] == "Compensated"


async def test_bad_references_fail_the_saga_before_any_call(
    kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess
) -> None:
    steps = [step("first", user="${steps.second.output.id}"), step("second")]
    await register_steps(kube, namespace, participant, steps)
    await kube.create("sagas", namespace, saga("refs", steps))
    failed = await saga_phase(kube, namespace, "refs", "Compensated")
    assert failed["status"]["stackDepth"] == 0
    reason = next(c for c in failed["status"]["conditions"] if c["type"] == "Succeeded")
    assert reason["reason"] == "InvalidReference"
    assert "step 'first' action refers to ${steps.second...}, which has not run before it" in reason["message"]
    assert participant.received() == []


def test_bad_order_is_refused_by_kubectl_with_the_step_named(cluster: Cluster, namespace: str) -> None:
    manifest = yaml.safe_dump(saga("order", [step("charge", "Pivot"), step("reserve")]))
    applied = cluster.kubectl("apply", "-n", namespace, "-f", "-", stdin=manifest, check=False)
    assert applied.returncode != 0
    assert 'step "reserve" (Compensatable) comes after step "charge" (Pivot)' in applied.stderr


async def test_kill_9_mid_forward_call_resends_under_the_same_key(
    kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess
) -> None:
    steps = [step("one"), step("two"), step("three")]
    participant.script("/two-do", Reply(200, {"late": True}, delay=3.0))
    await register_steps(kube, namespace, participant, steps)
    created = await kube.create("sagas", namespace, saga("crash", steps))
    await participant.until(lambda received: any(r.path == "/two-do" for r in received))
    operator.kill()
    operator.start()
    await saga_phase(kube, namespace, "crash", "Completed")
    assert paths(participant) == ["one-do", "two-do", "two-do", "three-do"]
    keys = [r.key for r in participant.received()]
    uid = created["metadata"]["uid"]
    assert keys == [f"{uid}:one:fwd", f"{uid}:two:fwd", f"{uid}:two:fwd", f"{uid}:three:fwd"]


def load(path: Path) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(path.read_text())
    return document


@pytest.fixture
def shop() -> Iterator[Callable[[], dict[str, Any]]]:
    """`python -m examples.order.services --port 8110`, as its docstring says; yields its state."""
    process = subprocess.Popen(
        [sys.executable, "-m", "examples.order.services", "--port", "8110"], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "shop ready"
    yield lambda: dict(httpx.get("http://127.0.0.1:8110/state", timeout=5).json())
    process.terminate()
    process.wait(timeout=10)


async def test_the_order_example_runs_as_documented(
    kube: Kube, namespace: str, operator: OperatorProcess, cluster: Cluster, shop: Callable[[], dict[str, Any]]
) -> None:
    """Start the shop, `kubectl apply` the Webhooks and the saga: it completes (the first email is
    refused and retried, forward past the pivot) and the warehouse is told."""
    applied = cluster.kubectl(
        "apply",
        "-n",
        namespace,
        "-f",
        str(REPO / "examples/order/webhooks.yaml"),
        "-f",
        str(REPO / "examples/order/saga.yaml"),
    )
    assert "saga.undolog.io/order-1042 created" in applied.stdout
    await eventually(
        lambda: kube.get("sagas", namespace, "order-1042"),
        lambda s: (s.get("status", {}).get("effects") or [{}])[0].get("state") == "Delivered",
        30,
        "order completed and warehouse notified",
    )
    state = await asyncio.to_thread(shop)
    assert state["captured"] == ["auth-1"]
    assert state["notified"] == ["res-1"]
    assert [c.split(" ")[0] for c in state["calls"]] == [
        "/stock/reserve",
        "/payments/authorize",
        "/payments/capture",
        "/emails/send",
        "/emails/send",
        "/warehouse/notify",
    ]


async def test_example_onboarding_saga_is_undone_when_the_email_times_out(
    kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess, cluster: Cluster
) -> None:
    manifest = load(REPO / "examples/onboarding/saga.yaml")
    for hook in yaml.safe_load_all((REPO / "examples/onboarding/webhooks.yaml").read_text()):
        function = hook["metadata"]["name"]
        await kube.create("webhooks", namespace, webhook(function, url=participant.url(f"/{function}")))
    participant.script("/create-user", Reply(200, {"user_id": "u-1"}))
    participant.handle("/send-email", lambda request: Reply(200, delay=5.0))  # slower than its 2 s timeout
    applied = cluster.kubectl("apply", "-n", namespace, "-f", str(REPO / "examples/onboarding/saga.yaml"))
    assert "saga.undolog.io/onboard-ada created" in applied.stdout  # `kubectl apply`, as design.md says
    name = manifest["metadata"]["name"]
    done = await saga_phase(kube, namespace, name, "Compensated", within=60)
    assert paths(participant) == [
        "create-user",
        "assign-permissions",
        "send-email",
        "send-email",
        "recall-email",
        "revoke-permissions",
        "delete-user",
    ]
    deleted: Received = participant.received("/delete-user")[0]
    assert deleted.body == {"user_id": "u-1"}
    assert done["status"]["failedStep"] == "send_welcome_email"
