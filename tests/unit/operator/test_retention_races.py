"""Retention against writers that race it: a saga changed while its deletion was in flight is
deleted at its new revision, never forgotten."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from tests.support.fakes import FixedFence
from tests.support.waiting import eventually
from tests.unit.operator.harness import NS, Operator
from undolog import errors
from undolog.api import Saga
from undolog.calls.pace import Rate
from undolog.controller.retention import Retention
from undolog.conventions import timestamp
from undolog.decisions.retention import RetentionPolicy


async def test_a_saga_labelled_while_its_deletion_is_in_flight_is_deleted_at_its_new_revision(
    operator: Operator,
) -> None:
    """The label's event came while the delete (preconditioned on the older revision) was on its
    way; its 409 made retention forget the saga, newer copy and all, and with no event after it
    the saga was kept forever (the archive chaos scenario: 7 of 24 sagas, a writer labelling them)."""
    body = operator.saga("s", phase="Completed")
    body = await operator.kube.patch("sagas", NS, "s", {"metadata": {"finalizers": None}})
    done = timestamp()
    body = await operator.kube.patch_status("sagas", NS, "s", {"status": {"completionTime": done, "expiresAt": done}})
    retention = Retention(
        operator.context.ledger, RetentionPolicy(completed=timedelta(0)), FixedFence(), Rate(per_second=1000)
    )
    plain = operator.kube.delete
    conflicts: list[str] = []

    async def racing(plural: Any, namespace: str, name: str, **preconditions: Any) -> None:
        if not conflicts:  # a person labels the saga; its watch event arrives before the 409
            labelled = await operator.kube.patch("sagas", NS, name, {"metadata": {"labels": {"team": "a"}}})
            retention.saga_seen(Saga.model_validate(labelled))
        try:
            await plain(plural, namespace, name, **preconditions)
        except errors.Conflict:
            conflicts.append(name)
            raise

    operator.kube.delete = racing  # type: ignore[method-assign]
    retention.saga_seen(Saga.model_validate(body))
    retention.start()
    try:

        async def gone() -> bool:
            return ("sagas", NS, "s") not in operator.kube.objects

        await eventually(gone, bool, 5, "the saga deleted at its new revision")
    finally:
        await retention.stop()
    assert conflicts == ["s"]
