"""The in-flight mark and writes that conflict or whose answer was lost: nothing sent twice."""

from __future__ import annotations

import asyncio

import pytest

from tests.unit.operator.harness import NS, Operator
from undolog import errors
from undolog.api import (
    EffectState,
    EntryState,
    UndoEntry,
)
from undolog.calls.transport import PreparedCall
from undolog.conventions import IN_FLIGHT_MARK_AFTER
from undolog.kube import Body, Plural


async def test_a_call_whose_in_flight_mark_cannot_be_written_is_not_cut_off_and_sent_again(
    operator: Operator,
) -> None:
    """The in-flight mark is written once a call takes longer than IN_FLIGHT_MARK_AFTER; under
    load that write can time out. The call the participant already has must not be cut off for
    it (the next reconcile would send it again as the same attempt)."""
    saga = operator.saga("slow", outcome="Abort")
    operator.entry(saga, 1)

    async def slow_while_the_api_times_out(call: PreparedCall) -> None:
        operator.kube.refuse[("patch", "undoentries")] = errors.KubeError("the request timed out", status=504)
        await asyncio.sleep(IN_FLIGHT_MARK_AFTER + 0.3)
        operator.kube.refuse.clear()

    operator.transport.on_send = slow_while_the_api_times_out
    done = await operator.drive("slow")
    assert len(operator.transport.sent) == 1
    assert done.status.phase == "Compensated"
    assert operator.state("slow-1")[1] == "Compensated"


async def test_a_call_that_ends_while_its_in_flight_mark_is_written_keeps_the_marks_copy(
    operator: Operator,
) -> None:
    """The in-flight mark's write has reached the API, unanswered, when the call ends: the outcome
    waits for that answer and is written on the copy it returns. Cut off, the mark would leave
    the outcome's write conditional on an older copy: a 409, and the entry decided again."""
    saga = operator.saga("slow", outcome="Abort")
    operator.entry(saga, 1)
    mark_landed, call_over = asyncio.Event(), asyncio.Event()
    plain = operator.kube.patch

    async def answered_after_the_call(plural: Plural, namespace: str, name: str, patch: Body, **at: str) -> Body:
        written = await plain(plural, namespace, name, patch, **at)
        if plural == "undoentries" and patch.get("status", {}).get("state") == "Running":
            mark_landed.set()
            await call_over.wait()
        return written

    async def over_once_marked(call: PreparedCall) -> None:
        async with asyncio.timeout(IN_FLIGHT_MARK_AFTER + 5):
            await mark_landed.wait()
        call_over.set()

    operator.kube.patch = answered_after_the_call  # type: ignore[method-assign]
    operator.transport.on_send = over_once_marked
    done = await operator.drive("slow")
    assert len(operator.transport.sent) == 1
    assert done.status.phase == "Compensated"
    assert operator.state("slow-1")[1] == "Compensated"


@pytest.mark.parametrize(
    ("queued", "at_participant", "marked"),
    [(IN_FLIGHT_MARK_AFTER + 0.3, 0.0, False), (0.0, IN_FLIGHT_MARK_AFTER + 0.3, True)],
)
async def test_only_a_call_slow_at_the_participant_is_marked_running(
    operator: Operator, queued: float, at_participant: float, marked: bool
) -> None:
    """The in-flight mark counts from when the call leaves: a call queued behind the operator's
    own (its participant's slots all taken, as at 100 sagas at once) costs no Running write."""
    operator.aborted("s", 1)
    operator.transport.queued = queued
    states: list[str] = []
    plain = operator.kube.patch

    async def recorded(plural: Plural, namespace: str, name: str, patch: Body, **at: str) -> Body:
        if plural == "undoentries" and "status" in patch:
            states.append(patch["status"].get("state", ""))
        return await plain(plural, namespace, name, patch, **at)

    async def slow(call: PreparedCall) -> None:
        await asyncio.sleep(at_participant)

    operator.kube.patch = recorded  # type: ignore[method-assign]
    operator.transport.on_send = slow
    done = await operator.drive("s")
    assert done.status.phase == "Compensated"
    assert states == (["Running", "Compensated"] if marked else ["Compensated"])


async def test_an_entry_write_that_would_overwrite_another_writers_state_says_what_changed(operator: Operator) -> None:
    """The write is refused (never overwrites), and the conflict names the field, its value and
    both resourceVersions: the log line of a driver that decides again says who moved what."""
    saga = operator.saga("s", outcome="Abort")
    stale = UndoEntry.model_validate(operator.entry(saga, 1))
    fresh = await operator.kube.patch_status("undoentries", NS, "s-1", {"status": {"state": "Running"}})
    ours = stale.status.model_copy(update={"state": EntryState.COMPENSATED})
    with pytest.raises(errors.Conflict) as refused:
        await operator.context.ledger.write_entry_status(stale, ours)
    assert refused.value.message == (
        f"UndoEntry {NS}/s-1: status state changed by another writer since resourceVersion "
        f"{stale.metadata.resource_version} (now {fresh['metadata']['resourceVersion']}, state=Running): "
        "not overwritten"
    )
    assert operator.state("s-1")[1] == "Running"


async def test_an_entry_write_that_landed_though_its_answer_was_lost_is_taken_as_written(operator: Operator) -> None:
    """An agent records its step's output; the connection breaks before the answer (an apiserver
    restart) and the SDK writes it again from the same copy: the API says Conflict, and the
    fresh copy already holds exactly this change. Refused as "changed by another writer", the
    agent's block failed and aborted a step that had committed."""
    saga = operator.saga("s")
    stale = UndoEntry.model_validate(operator.entry(saga, 1, effect="Executing"))
    ours = stale.status.model_copy(update={"effect": EffectState.COMMITTED, "output": {"id": "u-1", "parent": None}})
    landed = await operator.context.ledger.write_entry_status(stale, ours)  # its answer "lost"
    again = await operator.context.ledger.write_entry_status(stale, ours)
    assert again.metadata.resource_version == landed.metadata.resource_version  # nothing written twice
    assert (again.status.effect, again.status.output) == (EffectState.COMMITTED, {"id": "u-1", "parent": None})
    theirs = stale.status.model_copy(update={"effect": EffectState.FAILED})
    with pytest.raises(errors.Conflict, match="status effect changed by another writer"):
        await operator.context.ledger.write_entry_status(stale, theirs)  # another change is still refused


async def test_a_call_cut_off_by_a_lease_in_doubt_after_its_mark_is_sent_once_more_not_twice(
    operator: Operator,
) -> None:
    """The Lease falls in doubt while a slow call is on the wire (its entry already marked
    Running): the guard cuts the call off. The driver must try again from the marked copy; from
    its older one, the next try's writes conflicted and the participant got the key twice more."""
    operator.aborted("s", 1)

    async def cut_once(call: PreparedCall) -> None:
        if len(operator.transport.sent) == 1:
            await asyncio.sleep(IN_FLIGHT_MARK_AFTER + 0.3)  # marked Running meanwhile
            raise errors.NotLeading("the Lease is in doubt")

    operator.transport.on_send = cut_once
    await operator.run_until("s", "Compensated", within=10)
    assert [c.headers["Undolog-Attempt"] for c in operator.transport.sent] == ["1", "1"]
