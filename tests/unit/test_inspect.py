"""The read model people use (undolog.inspect) on an in-memory API: the requests it writes are
the ones the operator consumes, refused by the shared rules when they do not apply, and its
wait says why it stopped. The same requests and wait serve the SDK (ledger.request_*, until)."""

from __future__ import annotations

import re
from typing import Any, cast

import pytest

from tests.support.fakes import FakeKube
from tests.unit.test_phases import make_entry, make_saga
from undolog import errors
from undolog.api import Saga, SagaPhase
from undolog.conventions import ABORT_REASON_ANNOTATION
from undolog.errors import CommandError
from undolog.inspect import Inspector
from undolog.kube import Kube
from undolog.ledger import WaitTimedOut, until


def inspector_with(*sagas: Saga, entries: int = 0) -> tuple[Inspector, FakeKube]:
    kube = FakeKube()
    for saga in sagas:
        body = saga.to_api()
        kube.put("sagas", body)
        for position in range(1, entries + 1):
            entry = make_entry(position).to_api()
            entry["metadata"] |= {
                "namespace": "ns",
                "ownerReferences": [
                    {"apiVersion": "undolog.io/v1beta1", "kind": "Saga", "name": "s", "uid": body["metadata"]["uid"]}
                ],
            }
            kube.put("undoentries", entry)
    return Inspector(cast(Kube, kube)), kube


async def test_an_abort_writes_the_outcome_and_who_asked_why() -> None:
    inspector, kube = inspector_with(make_saga("Active"))
    await inspector.abort("ns", "s", "the card was declined")
    saga = kube.body("sagas", "ns", "s")
    assert saga["spec"]["outcome"] == "Abort"
    assert saga["metadata"]["annotations"][ABORT_REASON_ANNOTATION].startswith("the card was declined (by alice at ")


async def test_an_abort_of_a_finished_saga_is_refused_and_writes_nothing() -> None:
    inspector, kube = inspector_with(make_saga("Compensated"))
    with pytest.raises(CommandError, match="only an Active saga can be aborted"):
        await inspector.abort("ns", "s", "too late")
    assert ("patch", "sagas") not in kube.requests


async def test_a_rewind_to_a_step_asks_for_its_position() -> None:
    inspector, kube = inspector_with(make_saga("Active"), entries=3)
    request = await inspector.rewind("ns", "s", "step2", "try the second part again")
    assert request.to_position == 2
    assert kube.body("sagas", "ns", "s")["spec"]["rewind"]["toPosition"] == 2


async def test_a_wait_for_a_phase_the_saga_can_no_longer_reach_says_so_at_once() -> None:
    inspector, _ = inspector_with(make_saga("Compensated"))
    with pytest.raises(CommandError, match="ended Compensated; it will never be Completed"):
        await inspector.wait("ns", "s", SagaPhase.COMPLETED, within=30)


async def test_a_wait_that_runs_out_of_time_names_the_phase_it_saw() -> None:
    inspector, _ = inspector_with(make_saga("Halted"))
    with pytest.raises(CommandError, match=re.escape("is Halted, not Compensated, after 0.3 s")):
        await inspector.wait("ns", "s", SagaPhase.COMPENSATED, within=0.3, poll=0.05)


async def test_until_waits_out_an_api_that_cannot_be_reached() -> None:
    reads: list[str] = []
    saga = make_saga("Active")

    async def read() -> Saga:
        reads.append("read")
        if len(reads) <= 2:
            raise errors.Unavailable("the API could not be reached")
        return saga if len(reads) < 4 else make_saga("Compensated")

    def settled(found: Saga) -> Any:
        return found if found.status.phase == SagaPhase.COMPENSATED else None

    done = await until(read, settled, within=5, poll=0.01)
    assert (done.status.phase, len(reads)) == (SagaPhase.COMPENSATED, 4)
    with pytest.raises(WaitTimedOut) as late:
        await until(lambda: _return(saga), settled, within=0.05, poll=0.01)
    assert late.value.saga is saga


async def _return(saga: Saga) -> Saga:
    return saga


@pytest.mark.parametrize("phase", ["Compensated", "Completed"])
async def test_the_plan_of_a_finished_saga_is_empty_and_says_why_not_an_error(phase: str) -> None:
    inspector, _ = inspector_with(make_saga(phase), entries=2)
    planned = await inspector.plan("ns", "s")
    assert planned.steps == []
    assert planned.finished == phase
