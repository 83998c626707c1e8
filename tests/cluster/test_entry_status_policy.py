"""An UndoEntry's status is written with the object at undolog.io/v1beta2 (no status subresource
there), so RBAC on the object alone would let anyone allowed to annotate an entry rewrite its
outcome. The status policy (crds/, the chart) keeps the status to writers allowed
undoentries/status, as the subresource did: a person on call annotates, an agent records."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.conftest import Cluster
from tests.support.manifests import saga, undo_entry
from tests.support.waiting import eventually
from undolog.kube import Kube

pytestmark = pytest.mark.cluster

ENTRY = "undoentries.v1beta2.undolog.io"


def as_user(cluster: Cluster, namespace: str, user: str, *args: str) -> tuple[int, str]:
    done = cluster.kubectl(*args, "-n", namespace, f"--as={user}", check=False)
    return done.returncode, done.stdout + done.stderr


async def test_only_a_writer_allowed_undoentries_status_changes_an_entry_s_status(
    cluster: Cluster, kube: Kube, namespace: str
) -> None:
    created = await kube.create("sagas", namespace, saga("order"))
    await kube.create("undoentries", namespace, undo_entry("order", 1, owner_uid=created["metadata"]["uid"]))
    on_call, agent = f"on-call-{namespace}", f"agent-{namespace}"
    cluster.kubectl(
        "create", "role", "on-call", "-n", namespace, "--verb=get,patch", "--resource=undoentries.undolog.io"
    )
    cluster.kubectl(
        "create", "role", "agent", "-n", namespace, "--verb=get,patch",
        "--resource=undoentries.undolog.io,undoentries.undolog.io/status",
    )  # fmt: skip
    for role, user in (("on-call", on_call), ("agent", agent)):
        cluster.kubectl("create", "rolebinding", role, "-n", namespace, f"--role={role}", f"--user={user}")
    outcome = json.dumps({"status": {"state": "Compensated"}})

    async def refused() -> str:
        code, said = await asyncio.to_thread(
            as_user, cluster, namespace, on_call, "patch", ENTRY, "order-1", "--type=merge", "-p", outcome
        )
        return said if code != 0 and "undolog-undoentry-status" in said else ""

    said = await eventually(
        refused, bool, 30, "the on-call person's status write refused"
    )  # policies apply a moment late
    print(f"\nrefused: {said.strip()}")
    assert f"UndoEntry order-1: {on_call} may not write its status" in said
    assert f"grant patch on undoentries/status in namespace {namespace}" in said
    code, said = as_user(cluster, namespace, on_call, "annotate", ENTRY, "order-1", "team=payments")
    assert code == 0, said  # the rest of the entry stays theirs
    assert (await kube.get("undoentries", namespace, "order-1")).get("status", {}).get("state") is None

    code, said = as_user(cluster, namespace, agent, "patch", ENTRY, "order-1", "--type=merge", "-p", outcome)
    assert code == 0, said
    entry = await kube.get("undoentries", namespace, "order-1")
    assert (entry["status"]["state"], entry["metadata"]["annotations"]["team"]) == ("Compensated", "payments")
