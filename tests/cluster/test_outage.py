"""A participant's outage: sagas wait for it without spending retries (its breaker open, one
probe at a time), then go at the pace it can take (spec.limits); past spec.outageBudgetSeconds
a saga halts with ParticipantUnavailable, and a retry compensates it once the participant is back."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.test_compensation import abort, entry_states, external_saga
from tests.conftest import Cluster
from tests.support.manifests import call, webhook
from tests.support.operator_process import OperatorProcess
from tests.support.participants import AtMost, Participant, most_in_one_second
from tests.support.waiting import eventually, saga_phase
from undolog.kube import Body, Kube

pytestmark = pytest.mark.cluster


async def participant_state(kube: Kube, namespace: str) -> str | None:
    state = (await kube.get("webhooks", namespace, "refund")).get("status", {}).get("participant")
    return str(state) if state is not None else None


async def webhook_events(kube: Kube, namespace: str) -> list[str]:
    listed = await kube.request("GET", f"/api/v1/namespaces/{namespace}/events")
    return [e["reason"] for e in listed.get("items", []) if e["involvedObject"]["kind"] == "Webhook"]


@pytest.mark.fault  # a participant outage waited out (20 s): make chaos and CI, not make test
async def test_a_wave_waits_out_the_outage_and_then_goes_at_the_participants_pace(
    cluster: Cluster, kube: Kube, namespace: str, participant: Participant, tmp_path: Path
) -> None:
    sagas, limit, outage = 40, 15, 6.0
    hook = webhook("refund", url=participant.url("/refund"))
    # At most 13 leave in any second; arrival jitter on a loaded box can bunch them by a call or two.
    # Fewer slots than sagas and places in flight than slots: every kind of wait meets the others.
    hook["spec"]["limits"] = {"callsPerSecond": limit - 3, "burst": 1, "inFlight": 2}
    await kube.create("webhooks", namespace, hook)
    operator = OperatorProcess(cluster.kubeconfig, namespace, tmp_path, ("--verbose", "--max-concurrent-sagas=4"))
    operator.start()
    try:
        await wave(kube, namespace, participant, sagas, limit, outage)
    finally:
        operator.stop()


async def wave(kube: Kube, namespace: str, participant: Participant, sagas: int, limit: int, outage: float) -> None:
    names = [f"w{i:02d}" for i in range(sagas)]
    await asyncio.gather(*(external_saga(kube, namespace, n, [call("refund", n=k) for k in range(3)]) for n in names))
    participant.down()
    went_down = time.monotonic()
    await asyncio.gather(*(abort(kube, namespace, n) for n in names))
    await eventually(lambda: webhook_events(kube, namespace), lambda r: "ParticipantUnavailable" in r, 30, "opened")
    await eventually(lambda: participant_state(kube, namespace), lambda s: s == "Unavailable", 10, "said")
    await asyncio.sleep(max(outage - (time.monotonic() - went_down), 0))  # the outage lasts its time
    at_most = AtMost(limit)
    participant.handle("/refund", at_most)
    participant.up()
    back = time.monotonic()

    async def phases() -> list[str]:
        listed = await kube.list("sagas", namespace)
        return [s.get("status", {}).get("phase", "") for s in listed]

    final = await eventually(phases, lambda p: all(x in ("Compensated", "Halted") for x in p), 120, "all settled")
    assert final.count("Halted") == 0
    for name in names:
        assert await entry_states(kube, namespace, name) == {1: "Compensated", 2: "Compensated", 3: "Compensated"}
    arrivals = [r.at for r in participant.received("/refund")]
    assert len(arrivals) == sagas * 3
    assert at_most.refused == 0
    assert most_in_one_second(arrivals) <= limit
    assert max(arrivals) - back >= sagas * 3 / limit * 0.8  # paced, not all at once
    assert "ParticipantAvailable" in await webhook_events(kube, namespace)
    assert await participant_state(kube, namespace) == "Available"


async def test_past_its_outage_budget_a_saga_halts_participant_unavailable_and_a_retry_compensates_it(
    kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess
) -> None:
    hook = webhook("refund", url=participant.url("/refund"))
    hook["spec"]["outageBudgetSeconds"] = 3
    await kube.create("webhooks", namespace, hook)
    await external_saga(kube, namespace, "late", [call("refund")], compensationPolicy={"backoff": {"maxRetries": 0}})
    participant.down()
    await abort(kube, namespace, "late")
    halted: Body = await saga_phase(kube, namespace, "late", "Halted", within=30)
    assert halted["status"]["reason"] == "ParticipantUnavailable"
    entry: dict[str, Any] = await kube.get("undoentries", namespace, "late-1")
    assert entry["status"]["reason"] == "ParticipantUnavailable"
    assert f"participant {namespace}/refund did not answer for its outage budget (3 s" in entry["status"]["lastError"]
    participant.up()
    await kube.patch("sagas", namespace, "late", {"metadata": {"annotations": {"undolog.io/retry": "refunds back"}}})
    await saga_phase(kube, namespace, "late", "Compensated", within=30)
    assert len(participant.received("/refund")) == 1
