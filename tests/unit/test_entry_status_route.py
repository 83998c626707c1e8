"""Where an entry's status is written (ledger.EntryStatusRoute), on a fake API: with the object
at ENTRY_STATUS_VERSION where the CRDs serve it (one write, field owners dropped with it),
through /status where CRDs installed before do not (this release's SDK upgraded first), and
with the object again once they do."""

from __future__ import annotations

from typing import cast

import pytest

from tests.support.fakes import FakeKube
from tests.support.objects import entry_body
from undolog import errors
from undolog.api import EntryState, UndoEntry
from undolog.api.changes import changed
from undolog.kube import Kube
from undolog.ledger import RETRY_OBJECT_SECONDS, EntryStatusRoute, Ledger

NS = "a"


async def an_entry(kube: FakeKube) -> tuple[Ledger, UndoEntry]:
    """A registered entry, and a ledger with a route of its own (the process-wide one stays as is)."""
    ledger = Ledger(cast(Kube, kube), entry_route=EntryStatusRoute())
    created = await kube.create("undoentries", NS, entry_body("order", 1, namespace=NS))
    kube.requests.clear()
    return ledger, UndoEntry.model_validate(created)


def entry_writes(kube: FakeKube) -> list[str]:
    return [verb for verb, plural in kube.requests if plural == "undoentries" and verb != "get"]


async def compensated(ledger: Ledger, entry: UndoEntry) -> UndoEntry:
    return await ledger.write_entry_status(entry, changed(entry.status, {"state": EntryState.COMPENSATED}))


def stored_state(kube: FakeKube, entry: UndoEntry) -> str:
    return str(kube.objects[("undoentries", NS, entry.metadata.name)]["status"]["state"])


async def test_the_status_is_written_once_with_the_object() -> None:
    kube = FakeKube()
    ledger, entry = await an_entry(kube)
    written = await compensated(ledger, entry)
    assert (written.status.state, stored_state(kube, entry)) == (EntryState.COMPENSATED, "Compensated")
    assert entry_writes(kube) == ["patch"]
    assert not ledger.entry_route.subresource


async def test_before_the_crds_serve_the_version_it_goes_through_status_and_back_once_they_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kube = FakeKube(entry_status_with_object=False)
    ledger, entry = await an_entry(kube)
    written = await compensated(ledger, entry)
    assert (written.status.state, stored_state(kube, entry)) == (EntryState.COMPENSATED, "Compensated")
    assert entry_writes(kube) == ["patch", "patch-status"]  # a 404 (nothing written), then /status
    assert ledger.entry_route.subresource

    kube.requests.clear()
    written = await ledger.write_entry_status(written, changed(written.status, {"retry_count": 1}))
    assert entry_writes(kube) == ["patch-status"]  # straight there while the object is not served

    kube.entry_status_with_object = True  # helm upgrade replaced the CRDs
    since = ledger.entry_route.through_subresource_since
    assert since is not None
    monkeypatch.setattr("undolog.ledger.time.monotonic", lambda: since + RETRY_OBJECT_SECONDS + 1)
    kube.requests.clear()
    written = await ledger.write_entry_status(written, changed(written.status, {"retry_count": 2}))
    assert (written.status.retry_count, entry_writes(kube)) == (2, ["patch"])
    assert not ledger.entry_route.subresource


async def test_an_entry_deleted_is_not_found_on_either_route() -> None:
    kube = FakeKube()
    ledger, entry = await an_entry(kube)
    await kube.delete("undoentries", NS, entry.metadata.name)
    with pytest.raises(errors.NotFound):
        await compensated(ledger, entry)
    assert not ledger.entry_route.subresource


async def test_an_output_holding_a_null_is_kept_whole_on_either_route() -> None:
    for served in (True, False):
        kube = FakeKube(entry_status_with_object=served)
        ledger, entry = await an_entry(kube)
        answer = {"id": 7, "parent": None}
        written = await ledger.write_entry_status(entry, changed(entry.status, {"output": answer}))
        assert written.status.output == answer
        assert kube.objects[("undoentries", NS, entry.metadata.name)]["status"]["output"] == answer
        assert entry_writes(kube) == (["patch"] if served else ["patch", "patch-status"])
