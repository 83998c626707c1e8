"""The admission policy that refuses an UndoEntry its saga does not own, turned off for a
namespace: for the tests that write such entries on purpose (as a cluster without the policy,
or one written before it, would hold them)."""

from __future__ import annotations

import uuid

from tests.conftest import Cluster
from tests.support.manifests import undo_entry
from tests.support.waiting import eventually
from undolog.api.undo_entry import OWNER_POLICY_OPT_OUT
from undolog.errors import Invalid
from undolog.kube import Kube


async def owner_policy_off(cluster: Cluster, kube: Kube, namespace: str) -> None:
    """Label the namespace out of the policy, and wait until the API admits an unowned entry
    (admission reads namespaces from a cache a moment behind)."""
    cluster.kubectl("label", "namespace", namespace, f"{OWNER_POLICY_OPT_OUT}=off", "--overwrite")
    probe = f"probe-{uuid.uuid4().hex[:6]}"

    async def admitted() -> bool:
        try:
            await kube.create("undoentries", namespace, undo_entry(probe, 1))
        except Invalid:
            return False
        return True

    await eventually(admitted, bool, 30, "an unowned entry admitted")
    await kube.delete("undoentries", namespace, f"{probe}-1")
