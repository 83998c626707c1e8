"""The dependency order end to end: entries that declare `dependsOn` are undone as soon as
what depends on them is, independent ones together; without it, strict LIFO (the rest of the
suite). Checked against the participant's own record of what arrived when."""

from __future__ import annotations

import json
import time

import pytest
import yaml

from tests.chaos.invariants import Call, order_violations
from tests.cluster.test_cli import undolog
from tests.cluster.test_compensation import abort, entry_states, external_saga, register
from tests.conftest import Cluster
from tests.support.manifests import call, saga
from tests.support.operator_process import OperatorProcess
from tests.support.participants import Participant, Reply
from tests.support.waiting import saga_phase
from undolog.kube import Kube

pytestmark = pytest.mark.cluster
ANSWERED_AFTER = 1.0  # seconds the participant takes to answer each undo of the ten independent ones


def calls_of(participant: Participant, saga_ref: str) -> dict[str, list[Call]]:
    by_key: dict[str, list[Call]] = {}
    for r in participant.received():
        by_key.setdefault(r.key, []).append(Call(r.key, saga_ref, r.path, r.at, r.replied))
    return by_key


async def test_ten_independent_compensations_run_together(
    kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess
) -> None:
    """Each undo is answered 1 s after it arrives: all ten arriving within that second were in
    flight together (one after another, the last would arrive 9 s after the first)."""
    participant.handle("/undo", lambda request: Reply(200, delay=ANSWERED_AFTER))
    await register(kube, namespace, participant, "undo")
    independent: dict[int, list[str]] = {position: [] for position in range(1, 11)}
    await external_saga(kube, namespace, "wide", [call("undo", n=n) for n in range(1, 11)], depends_on=independent)
    aborted = time.monotonic()
    await abort(kube, namespace, "wide")
    await saga_phase(kube, namespace, "wide", "Compensated")
    total = time.monotonic() - aborted  # includes the waiting helper's own polling
    arrivals = sorted(r.at for r in participant.received("/undo"))
    assert len(arrivals) == 10
    spread = arrivals[-1] - arrivals[0]
    print(f"\n10 independent compensations of 1 s each: sent within {spread * 1000:.0f} ms, {total:.2f} s in all")
    assert spread < ANSWERED_AFTER


async def test_a_diamond_is_respected_under_retries_and_a_kill_9(
    kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess
) -> None:
    # step1 <- step2, step3 <- step4 (step4 depends on 2 and 3; both depend on 1).
    participant.script("/undo-2", Reply(503), Reply(503))  # retried under one key
    participant.script("/undo-3", Reply(200, delay=3.0))  # in flight when the operator dies
    await register(kube, namespace, participant, "undo-1", "undo-2", "undo-3", "undo-4")
    diamond = {2: ["step1"], 3: ["step1"], 4: ["step2", "step3"]}
    await external_saga(kube, namespace, "diamond", [call(f"undo-{p}") for p in range(1, 5)], depends_on=diamond)
    await abort(kube, namespace, "diamond")
    # 2 and 3 are sent together; kill the operator while 3 is still in flight.
    await participant.until(lambda received: {"/undo-2", "/undo-3"} <= {r.path for r in received})
    operator.kill()
    operator.start()
    await saga_phase(kube, namespace, "diamond", "Compensated", within=60)
    received = participant.received()
    paths = [r.path for r in received]
    assert (paths[0], paths[-1]) == ("/undo-4", "/undo-1")
    assert (paths.count("/undo-1"), paths.count("/undo-4")) == (1, 1)
    assert len({r.key for r in received if r.path == "/undo-3"}) == 1  # the re-send after the kill: same key
    stack = [await kube.get("undoentries", namespace, f"diamond-{p}") for p in range(1, 5)]
    assert order_violations("diamond", stack, calls_of(participant, "diamond")) == []
    assert await entry_states(kube, namespace, "diamond") == dict.fromkeys(range(1, 5), "Compensated")
    timing = {p: min(r.at for r in received if r.path == f"/undo-{p}") for p in (2, 3)}
    assert abs(timing[2] - timing[3]) < 1.0  # 2 and 3 went together, not one after the other


async def test_a_plan_shows_the_waves(kube: Kube, namespace: str, participant: Participant, cluster: Cluster) -> None:
    await register(kube, namespace, participant, "undo")
    diamond = {2: ["step1"], 3: ["step1"], 4: ["step2", "step3"]}
    await external_saga(kube, namespace, "planned", [call("undo", n=p) for p in range(1, 5)], depends_on=diamond)
    shown = undolog(cluster, "plan", "planned", "-n", namespace, "-o", "json")
    order = [(p["order"], p["stackPosition"]) for p in json.loads(shown.stdout)["items"]]
    assert order == [(1, 4), (2, 3), (2, 2), (3, 1)]


def test_a_dependency_on_a_later_or_unknown_step_is_refused_by_kubectl(cluster: Cluster, namespace: str) -> None:
    steps = [
        {"name": "create_user", "action": call("create"), "compensation": call("delete")},
        {"name": "grant", "action": call("grant"), "compensation": call("revoke"), "dependsOn": ["send_email"]},
        {"name": "send_email", "action": call("send"), "compensation": call("recall")},
    ]
    applied = cluster.kubectl(
        "apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(saga("deps", steps)), check=False
    )
    assert applied.returncode != 0
    assert 'step "grant" dependsOn send_email, which is not a step before it' in applied.stderr
    steps[1]["dependsOn"] = ["create_user"]
    cluster.kubectl("apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(saga("deps", steps)))
