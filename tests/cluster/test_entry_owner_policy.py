"""An UndoEntry its saga does not own is never compensated: refused when it is written (the
admission policy crds/ and the chart install), and where one exists all the same (a cluster
without the policy, a namespace opted out, an entry older than the policy) its saga halts with
`UnownedEntries` instead of reading Compensated."""

from __future__ import annotations

import pytest

from tests.cluster.test_compensation import abort, register
from tests.cluster.test_faults import committed_entry
from tests.conftest import Cluster
from tests.support.manifests import API, call, saga, undo_entry
from tests.support.operator_process import OperatorProcess
from tests.support.owner_policy import owner_policy_off
from tests.support.participants import Participant
from tests.support.waiting import eventually, saga_phase
from undolog.conventions import RETRY_ANNOTATION
from undolog.errors import Invalid
from undolog.kube import Kube

pytestmark = pytest.mark.cluster


async def refusal(kube: Kube, namespace: str, body: dict[str, object]) -> str:
    """The API's message refusing `body` (the policy applies a moment after it is created)."""

    async def refused() -> str:
        try:
            await kube.create("undoentries", namespace, body)
        except Invalid as error:
            return error.message
        await kube.delete("undoentries", namespace, str(body["metadata"]["name"]))  # type: ignore[index]
        return ""

    return await eventually(refused, bool, 30, "the entry refused")


async def test_an_entry_its_saga_does_not_own_is_refused_when_written_naming_the_fix(
    kube: Kube, namespace: str
) -> None:
    created = await kube.create("sagas", namespace, saga("order"))
    uid = created["metadata"]["uid"]
    message = await refusal(kube, namespace, undo_entry("order", 1))
    print(f"\nrefused: {message}")
    assert "UndoEntry order-1 names Saga order in spec.saga but is not owned by it" in message
    assert "add metadata.ownerReferences [{apiVersion: undolog.io/v1beta1, kind: Saga, name: order" in message
    foreign = undo_entry("order", 1, owner_uid=uid)
    foreign["metadata"]["ownerReferences"][0]["name"] = "another"
    assert "is not owned by it" in await refusal(kube, namespace, foreign)

    owned = await kube.create("undoentries", namespace, undo_entry("order", 1, owner_uid=uid))
    assert owned["metadata"]["ownerReferences"][0]["uid"] == uid
    with pytest.raises(Invalid, match="is not owned by it"):  # nor can the owner be taken off later
        await kube.patch("undoentries", namespace, "order-1", {"metadata": {"ownerReferences": None}})
    labelled = await kube.patch("undoentries", namespace, "order-1", {"metadata": {"labels": {"team": "a"}}})
    assert labelled["metadata"]["labels"]["team"] == "a"


async def test_a_saga_aborted_with_an_entry_it_does_not_own_halts_and_is_listed_with_the_halted(
    cluster: Cluster, kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess
) -> None:
    """As a kubectl user or a non-Python agent wrote them where the policy is off: entry 1 owned,
    entry 2 naming the saga without an ownerReference. The abort undoes 1, then halts on 2 (its
    refund was never called), where a person finds it; owned by hand, it is undone on retry."""
    await owner_policy_off(cluster, kube, namespace)
    await register(kube, namespace, participant, "undo")
    created = await kube.create("sagas", namespace, saga("agent"))
    uid = created["metadata"]["uid"]
    await committed_entry(kube, namespace, created, 1)
    unowned = undo_entry("agent", 2, compensation=call("undo", n=2))
    await kube.create("undoentries", namespace, unowned)
    await kube.patch_status("undoentries", namespace, "agent-2", {"status": {"effect": "Committed"}})
    await abort(kube, namespace, "agent")
    halted = await saga_phase(kube, namespace, "agent", "Halted")

    assert halted["status"]["reason"] == "UnownedEntries"
    assert halted["status"]["unownedEntries"] == ["agent-2"]
    print(f"\nhalted: {halted['status']['message']}")
    assert halted["status"]["message"].startswith(
        f"agent-2 names this saga in spec.saga but it does not own it (no ownerReference to uid {uid})"
    )
    assert [r.body["n"] for r in participant.received("/undo")] == [1]
    listed = cluster.kubectl("get", "sagas", "-n", namespace, "-l", "undolog.io/phase=halted", "-o", "name")
    assert listed.stdout.split() == ["saga.undolog.io/agent"]

    owner = {"apiVersion": API, "kind": "Saga", "name": "agent", "uid": uid}
    await kube.patch("undoentries", namespace, "agent-2", {"metadata": {"ownerReferences": [owner]}})
    await kube.patch("sagas", namespace, "agent", {"metadata": {"annotations": {RETRY_ANNOTATION: "owned it"}}})
    done = await saga_phase(kube, namespace, "agent", "Compensated")
    assert done["status"].get("unownedEntries", []) == []
    assert [r.body["n"] for r in participant.received("/undo")] == [1, 2]
