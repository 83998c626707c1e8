"""Retention end to end: finished sagas leave etcd with their entries once due, from the times
their status records (so an operator started again deletes exactly what was due), and a Halted
saga never goes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.test_cli import undolog
from tests.cluster.test_compensation import abort, external_saga, register, saga_or_none
from tests.conftest import Cluster
from tests.support.manifests import call
from tests.support.operator_process import OperatorProcess
from tests.support.participants import Participant
from tests.support.waiting import eventually, saga_phase
from undolog.kube import Kube

pytestmark = pytest.mark.cluster


async def deleted(kube: Kube, namespace: str, name: str, within: float = 30) -> None:
    await eventually(lambda: saga_or_none(kube, namespace, name), lambda s: s is None, within, f"{name} deleted")


async def entries_left(kube: Kube, namespace: str, saga: str) -> int:
    return len(await kube.list("undoentries", namespace, field_selector=f"spec.saga={saga}"))


async def no_entries_left(kube: Kube, namespace: str, saga: str) -> None:
    await eventually(lambda: entries_left(kube, namespace, saga), lambda c: c == 0, 60, f"{saga}'s entries collected")


async def test_finished_sagas_go_with_their_entries_once_due_and_a_halted_one_stays(
    cluster: Cluster, kube: Kube, namespace: str, participant: Participant, tmp_path: Path
) -> None:
    operator = OperatorProcess(
        cluster.kubeconfig, namespace, tmp_path, ("--ttl-after-completed=2s", "--ttl-after-compensated=3s")
    )
    operator.start()
    try:
        await register(kube, namespace, participant, "delete-user")  # "revoke" is no Webhook: that saga halts
        await external_saga(kube, namespace, "done", [call("delete-user")], outcome="Commit")
        await external_saga(kube, namespace, "undone", [call("delete-user"), call("delete-user")])
        await external_saga(kube, namespace, "stuck", [call("revoke")], ttlSecondsAfterFinished=0)
        await abort(kube, namespace, "undone")
        await abort(kube, namespace, "stuck")
        completed = await saga_phase(kube, namespace, "done", "Completed")
        compensated = await saga_phase(kube, namespace, "undone", "Compensated")
        await saga_phase(kube, namespace, "stuck", "Halted")
        for body, ttl in ((completed, 2), (compensated, 3)):
            status = body["status"]
            expires = datetime.fromisoformat(status["expiresAt"]) - datetime.fromisoformat(status["completionTime"])
            assert expires == timedelta(seconds=ttl)
        for name in ("done", "undone"):
            await deleted(kube, namespace, name)
            await no_entries_left(kube, namespace, name)
        halted = await kube.get("sagas", namespace, "stuck")  # its TTL of 0 ran out long ago: a person is needed
        assert halted["status"]["phase"] == "Halted"
        assert "expiresAt" not in halted["status"]
        assert await entries_left(kube, namespace, "stuck") == 1
        assert "deleted finished saga" in operator.log()
    finally:
        operator.stop()


async def test_an_operator_started_again_deletes_exactly_the_sagas_that_fell_due_meanwhile(
    cluster: Cluster, kube: Kube, namespace: str, participant: Participant, tmp_path: Path
) -> None:
    operator = OperatorProcess(cluster.kubeconfig, namespace, tmp_path)
    operator.start()
    await register(kube, namespace, participant, "delete-user")
    names = ("soon-1", "soon-2", "later", "kept")
    for name in names:
        await external_saga(kube, namespace, name, [call("delete-user")])
        await abort(kube, namespace, name)
    for name in names:
        await saga_phase(kube, namespace, name, "Compensated")
    operator.stop()
    # While no operator runs, two of them fall due (their TTL, set now, ran out at once) and one will later.
    for name, ttl in (("soon-1", 1), ("soon-2", 1), ("later", 3600)):
        await kube.patch("sagas", namespace, name, {"spec": {"ttlSecondsAfterFinished": ttl}})
    operator.start()
    try:
        for name in ("soon-1", "soon-2"):
            await deleted(kube, namespace, name)
        for name in ("later", "kept"):
            assert await saga_or_none(kube, namespace, name) is not None
        assert operator.log().count("deleted finished saga") == 2
    finally:
        operator.stop()


async def deletion_time(kube: Kube, namespace: str, name: str, expected: timedelta) -> datetime:
    """The saga's status.expiresAt once it is its completion time plus `expected`."""

    def stamped(body: dict[str, Any]) -> bool:
        status = body.get("status", {})
        if not status.get("expiresAt") or not status.get("completionTime"):
            return False
        return (
            datetime.fromisoformat(status["expiresAt"]) - datetime.fromisoformat(status["completionTime"]) == expected
        )

    body = await eventually(lambda: kube.get("sagas", namespace, name), stamped, 30, f"{name}'s expiresAt stamped")
    return datetime.fromisoformat(body["status"]["expiresAt"])


async def deleted_at(kube: Kube, namespace: str, name: str) -> datetime:
    """When the saga was seen gone (polled every 0.05 s), on this machine's clock."""
    await deleted(kube, namespace, name, within=60)
    return datetime.now(UTC)


async def test_a_finished_saga_goes_at_the_time_its_status_shows_after_its_ttl_is_edited_or_the_default_changes(
    cluster: Cluster, kube: Kube, namespace: str, participant: Participant, tmp_path: Path
) -> None:
    """One deletion time: status.expiresAt, which `undolog list` and the dashboard show, stamped
    again when the saga's TTL is edited or the operator starts with another default; the
    saga goes at that time, not at one recomputed elsewhere."""
    operator = OperatorProcess(cluster.kubeconfig, namespace, tmp_path, ("--ttl-after-completed=1h",))
    operator.start()
    try:
        await register(kube, namespace, participant, "delete-user")
        for name in ("edited", "defaulted"):
            await external_saga(kube, namespace, name, [call("delete-user")], outcome="Commit")
            await saga_phase(kube, namespace, name, "Completed")
            await deletion_time(kube, namespace, name, timedelta(hours=1))
        await kube.patch("sagas", namespace, "edited", {"spec": {"ttlSecondsAfterFinished": 6}})
        shown = await deletion_time(kube, namespace, "edited", timedelta(seconds=6))
        listed = undolog(cluster, "list", "-n", namespace, "-o", "wide")
        print(f"\n{listed.stdout}")
        gone = await deleted_at(kube, namespace, "edited")
        print(f"edited: expiresAt {shown.isoformat()}, deleted by {gone.isoformat()}")
        assert shown <= gone < shown + timedelta(seconds=3)
        operator.stop()
        operator.extra_args = (*operator.extra_args[:-1], "--ttl-after-completed=14s")  # another default
        operator.start()
        shown = await deletion_time(kube, namespace, "defaulted", timedelta(seconds=14))
        gone = await deleted_at(kube, namespace, "defaulted")
        print(f"defaulted: expiresAt {shown.isoformat()}, deleted by {gone.isoformat()}")
        assert shown <= gone < shown + timedelta(seconds=3)
    finally:
        operator.stop()
