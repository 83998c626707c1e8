"""The storage migration on fakes: a Lease this replica created means a new installation (nothing
written again), one an earlier release's operator held means every object is written again once,
and the Lease remembers it either way."""

from __future__ import annotations

import pytest

from tests.support.fakes import FakeKube, FixedFence
from tests.support.objects import entry_body
from tests.unit.test_leadership import FakeLeases
from undolog.calls.pace import Rate
from undolog.controller.leadership import LeaseSettings
from undolog.controller.storage_migration import StorageMigration
from undolog.conventions import STORED_AS_ANNOTATION
from undolog.ledger import Ledger

ME = "replica-a"


def lease(holder: str, transitions: int) -> dict[str, object]:
    return {
        "metadata": {"name": "undolog-operator", "namespace": "ns", "resourceVersion": "1"},
        "spec": {"holderIdentity": holder, "leaseTransitions": transitions},
    }


@pytest.mark.parametrize(
    ("holder", "transitions", "written"),
    [
        (ME, 0, []),  # created by this replica: a new installation
        (ME, 1, [("patch", "sagas"), ("patch", "undoentries")]),  # taken over from the previous release
    ],
)
async def test_objects_are_written_again_only_where_an_earlier_release_led(
    holder: str, transitions: int, written: list[tuple[str, str]]
) -> None:
    kube = FakeKube()
    kube.put("sagas", {"metadata": {"name": "s", "namespace": "ns"}, "spec": {}})
    kube.put("undoentries", entry_body("s", 1))
    leases = FakeLeases({"undolog-operator": lease(holder, transitions)})
    settings = LeaseSettings("ns")
    migration = StorageMigration(kube, Ledger(kube), leases, settings, FixedFence(), Rate(1000), ME, ["ns"])
    kube.requests.clear()
    await migration.run()
    assert [r for r in kube.requests if r[0] == "patch"] == written
    annotations = leases.stored["undolog-operator"]["metadata"]["annotations"]
    assert annotations[STORED_AS_ANNOTATION] == "v1beta1"
    kube.requests.clear()
    await migration.run()  # remembered: nothing again
    assert kube.requests == []
