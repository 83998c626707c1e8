"""Compensating a saga's entries: the calls, their order and keys, what is written of each outcome."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.waiting import eventually
from tests.unit.operator.harness import NS, OK, Operator
from undolog.api import (
    EntryReason,
    UndoEntry,
)
from undolog.calls.transport import PreparedCall
from undolog.controller.driver import SagaDriver
from undolog.conventions import RETRY_ANNOTATION
from undolog.decisions.lost_entries import lost_entry
from undolog.decisions.retry import CallOutcome
from undolog.kube import Body, Plural


async def test_an_aborted_saga_is_compensated_newest_first_with_the_protocols_headers(operator: Operator) -> None:
    operator.aborted("s", 3)
    done = await operator.drive("s")
    assert done.status.phase == "Compensated"
    assert done.status.compensated_count == 3
    assert operator.undone() == [3, 2, 1]
    first = operator.transport.sent[0]
    entry3 = operator.kube.body("undoentries", NS, "s-3")
    assert first.headers["Idempotency-Key"] == f"undo-{entry3['spec']['undoId']}"
    assert first.headers["Undolog-Forward-Key"] == "uid:step3:fwd"
    assert first.headers["Undolog-Saga"] == "ns/s"
    assert first.headers["Undolog-Fence"] == "7"
    assert [operator.state(f"s-{p}")[1] for p in (1, 2, 3)] == ["Compensated"] * 3


async def test_entries_compensated_together_keep_their_outcomes_when_one_write_is_lost(operator: Operator) -> None:
    """Three independent entries are compensated together (the first in the driver's task, the
    others beside it). Another writer changes the newest one while its call is made, so its
    outcome write is refused: the other two outcomes are still written and kept, and only the
    newest is called again, under its key."""
    saga = operator.saga("s", outcome="Abort")
    for position in (1, 2, 3):
        body = operator.entry(saga, position, indexed=False)
        body["spec"]["dependsOn"] = []
        operator.context.index.keep(UndoEntry.model_validate(operator.kube.put("undoentries", body)))
    plain, refused, older_left = operator.kube.patch, asyncio.Event(), asyncio.Event()
    lost: list[str] = []

    async def newest_changed_meanwhile(plural: Plural, namespace: str, name: str, patch: Body, **at: str) -> Body:
        if name == "s-3" and patch.get("status", {}).get("state") == "Compensated" and not lost:
            lost.append(name)
            await plain(plural, namespace, name, {"status": {"state": "Running"}}, **at)  # the other writer
            refused.set()
        return await plain(plural, namespace, name, patch, **at)

    async def all_three_at_the_participant(call: PreparedCall) -> None:
        async with asyncio.timeout(5):
            if call.body["n"] == 3:  # its outcome is refused only once the older two have left
                await older_left.wait()
            elif not refused.is_set():
                if len(operator.transport.sent) == 3:
                    older_left.set()
                await refused.wait()

    operator.kube.patch = newest_changed_meanwhile  # type: ignore[method-assign]
    operator.transport.on_send = all_three_at_the_participant
    await operator.run_until("s", "Compensated", within=5)
    assert lost == ["s-3"]
    assert sorted(operator.undone()) == [1, 2, 3, 3]
    keys = {c.headers["Idempotency-Key"] for c in operator.transport.sent if c.body["n"] == 3}
    assert len(keys) == 1  # the repeat is under the same key
    assert [operator.state(f"s-{p}")[1] for p in (1, 2, 3)] == ["Compensated"] * 3


async def test_the_first_compensation_leaves_before_the_failure_is_written(operator: Operator) -> None:
    """From the decision to compensate to the call, no turn of the event loop: with sagas
    failing together, each turn waits for all else that is ready (milliseconds a hop, issue 14).
    The phase is written beside the call, after it has been handed to the transport."""
    requests, send = operator.kube.requests, operator.transport.send

    async def handed(call: PreparedCall) -> CallOutcome:
        requests.append(("call", call.target.url))
        return await send(call)

    operator.transport.send = handed  # type: ignore[method-assign]
    saga = operator.saga("s", outcome="Abort")
    for position in (1, 2):
        operator.entry(saga, position)
    done = await operator.drive("s")
    assert done.status.phase == "Compensated"
    first_call = requests.index(("call", "http://participant.test/undo"))
    assert ("patch-status", "sagas") not in requests[:first_call], requests
    assert ("patch-status", "sagas") in requests[first_call:]


async def test_an_entry_the_watch_has_not_delivered_is_still_compensated_first(operator: Operator) -> None:
    """Defect 1 at this layer: the index (fed by the watch) lacks the newest entry, as after an
    apiserver outage; the consistent LIST before compensating finds it, so LIFO holds."""
    saga = operator.aborted("s", 1)
    operator.entry(saga, 2, indexed=False)
    done = await operator.drive("s")
    assert operator.undone() == [2, 1]
    assert done.status.compensated_count == 2
    lists = [r for r in operator.kube.requests if r == ("list", "undoentries")]
    assert len(lists) == 2  # before the first call, and before declaring it Compensated


async def test_an_entry_registered_during_compensation_is_compensated_before_the_saga_is_done(
    operator: Operator,
) -> None:
    saga = operator.aborted("s", 1)

    def register_late(call: PreparedCall) -> None:
        if not operator.transport.sent[:-1]:  # while the first compensation is in flight
            operator.entry(saga, 2, indexed=False)

    operator.transport.on_send = register_late
    done = await operator.drive("s")
    assert done.status.phase == "Compensated"
    assert done.status.compensated_count == 2
    assert sorted(operator.undone()) == [1, 2]


async def test_transient_failures_are_retried_under_one_key_then_a_permanent_one_halts(operator: Operator) -> None:
    operator.transport.script(
        "/undo",
        CallOutcome(status_code=503, error="HTTP 503"),
        OK,  # entry 2 after one retry
        CallOutcome(status_code=400, error="HTTP 400: unknown grant"),  # entry 1: permanent
    )
    saga = operator.aborted("s", 1)
    operator.entry(saga, 2)
    halted = await operator.drive("s")
    assert halted.status.phase == "Halted"
    assert halted.status.reason == "CompensationFailed"
    keys = [c.headers["Idempotency-Key"] for c in operator.transport.sent]
    assert keys[0] == keys[1] != keys[2]
    assert [c.headers["Undolog-Attempt"] for c in operator.transport.sent] == ["1", "2", "1"]
    entry2 = operator.kube.body("undoentries", NS, "s-2")["status"]
    assert (entry2["state"], entry2["retryCount"]) == ("Compensated", 1)
    assert [a.get("statusCode") for a in entry2["attempts"]] == [503, 200]
    entry1 = operator.kube.body("undoentries", NS, "s-1")["status"]
    assert (entry1["state"], entry1["reason"]) == ("Failed", "PermanentFailure")


async def test_an_unregistered_function_is_recorded_by_reason_and_nothing_is_sent(operator: Operator) -> None:
    saga = operator.saga("s", outcome="Abort")
    operator.entry(saga, 1, compensation={"function": "nowhere"})
    halted = await operator.drive("s")
    assert halted.status.reason == "FunctionNotFound"  # from the entry's reason, not its text
    entry = operator.kube.body("undoentries", NS, "s-1")["status"]
    assert entry["reason"] == "FunctionNotFound"
    assert entry["lastError"].startswith("FunctionNotFound: no Webhook 'nowhere'")
    assert operator.transport.sent == []


async def test_a_target_refused_by_the_transport_is_permanent(operator: Operator) -> None:
    refused = CallOutcome(
        error="127.0.0.1:80 is refused by the operator's egress policy", refusal=EntryReason.TARGET_REFUSED
    )
    operator.transport.script("/undo", refused)
    operator.aborted("s", 1)
    halted = await operator.drive("s")
    assert halted.status.phase == "Halted"
    entry = operator.kube.body("undoentries", NS, "s-1")["status"]
    assert entry["reason"] == "TargetRefused"
    assert "refused: nothing was sent" in entry["lastError"]
    assert len(operator.transport.sent) == 1  # not retried


async def test_an_agent_writing_its_entry_during_the_compensation_costs_no_second_call(operator: Operator) -> None:
    saga = operator.saga("s", outcome="Abort")
    operator.entry(saga, 1, effect="Executing")

    async def agent_records_its_effect(call: PreparedCall) -> None:
        await operator.kube.patch_status("undoentries", NS, "s-1", {"status": {"effect": "Committed"}})

    operator.transport.on_send = agent_records_its_effect
    done = await operator.drive("s")
    assert done.status.phase == "Compensated"
    assert len(operator.transport.sent) == 1
    assert operator.state("s-1") == ("Committed", "Compensated")


async def test_the_first_compensation_leaves_while_the_failure_is_being_written(operator: Operator) -> None:
    """Abort to first call: the write of Compensating (an fsync) and the first call go together.
    The saga's status write is held until the call has left; written one after the other, the
    call would never leave and the write would give up."""
    saga = operator.saga("s", outcome="Abort")
    for position in (1, 2):
        operator.entry(saga, position)
    sent = asyncio.Event()
    operator.transport.on_send = lambda call: sent.set()
    plain = operator.kube.patch_status

    async def held_until_the_call_left(plural: Plural, namespace: str, name: str, patch: Body) -> Body:
        if plural == "sagas" and patch.get("status", {}).get("phase") == "Compensating":
            async with asyncio.timeout(2):
                await sent.wait()
        return await plain(plural, namespace, name, patch)

    operator.kube.patch_status = held_until_the_call_left  # type: ignore[method-assign]
    done = await operator.drive("s")
    assert done.status.phase == "Compensated"
    assert operator.undone() == [2, 1]  # still newest first: only the first call overlaps the write


async def test_a_failure_write_that_conflicts_does_not_send_the_first_compensation_twice(operator: Operator) -> None:
    """The write of Compensating loses to another writer while the first call is made: the
    driver decides again on what it reads, and the entry already compensated is not sent again."""
    saga = operator.saga("s", outcome="Abort")
    for position in (1, 2):
        operator.entry(saga, position)
    conflicts = operator.saga_write_lost_once()
    await operator.run_until("s", "Compensated", within=5)
    assert conflicts == ["s"]
    assert operator.undone() == [2, 1]


async def test_a_conflict_after_a_compensation_does_not_send_it_again(
    operator: Operator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seen at 1,000 sagas: an entry compensated, then the saga's progress write lost to the
    benchmark's own abort patch (409); the driver decided again from an index that lacked what
    the compensation had written (the watch lagging), and called the entry again as attempt 1."""
    monkeypatch.setattr("undolog.controller.saga_status.COUNTER_INTERVAL", 0.0)  # progress after every entry
    saga = operator.saga("s", outcome="Abort")
    for position in (1, 2):
        operator.entry(saga, position)

    def progress(patch: Body) -> bool:
        status = patch.get("status", {})
        return bool(status.get("phase") == "Compensating" and status.get("compensatedCount", 0) > 0)

    conflicts = operator.saga_write_lost_once(progress)
    await operator.run_until("s", "Compensated", within=5)
    assert conflicts == ["s"]
    assert operator.undone() == [2, 1]


async def test_a_lost_entry_whose_report_loses_to_another_writer_is_reported_again(operator: Operator) -> None:
    """An entry deleted by hand is reported on its saga; when that status write loses to another
    writer (a person annotating the saga at that moment), the report is made again on the newer
    copy, and the saga halts on it instead of compensating as though the entry never was."""
    saga = operator.saga("s", outcome="Abort")
    entries = [operator.entry(saga, position) for position in (1, 2, 3)]
    gone = UndoEntry.model_validate(entries[0])
    del operator.kube.objects[("undoentries", NS, gone.metadata.name)]
    operator.context.index.deleted(gone)
    conflicts = operator.saga_write_lost_once(lambda patch: "lostEntries" in patch.get("status", {}))
    driver = SagaDriver(operator.context, NS, "s")
    driver.lose(lost_entry(gone, "deleted by hand"))
    driver.task = asyncio.create_task(driver.run())

    async def phase() -> str:
        return str(operator.kube.body("sagas", NS, "s")["status"].get("phase"))

    await eventually(phase, lambda now: now in ("Halted", "Compensated"), 5, "saga s settled")
    driver.notify(None)
    await driver.task
    status = operator.kube.body("sagas", NS, "s")["status"]
    assert conflicts == ["s"]
    assert (status["phase"], status["reason"]) == ("Halted", "EntryLost")
    assert [e["name"] for e in status["lostEntries"]] == ["s-1"]
    assert operator.undone() == [3, 2]


async def test_a_compensation_whose_arguments_resolve_past_the_bound_halts_and_says_why(operator: Operator) -> None:
    operator.webhook("create")
    operator.webhook("grant")
    operator.transport.script("/create", CallOutcome(status_code=200, output={"blob": "x" * 15_000}))
    operator.transport.script("/grant", CallOutcome(status_code=400, error="HTTP 400"))
    copies = {"copies": ["${steps.create.output}"] * 100}
    steps = [
        {"name": "create", "action": {"function": "create"}, "compensation": {"function": "undo", "args": copies}},
        {"name": "grant", "action": {"function": "grant"}, "compensation": {"function": "undo", "args": {"n": 2}}},
    ]
    operator.saga("o", steps=steps)
    done = await operator.drive("o")
    assert (done.status.phase, done.status.reason) == ("Halted", "CompensationFailed")
    assert "come to more than 1048576 bytes" in (done.status.message or "")
    assert operator.transport.paths() == ["/create", "/grant", "/undo"]  # the second step's undo only
    entry = operator.kube.body("undoentries", NS, "o-1")["status"]
    assert (entry["state"], entry["reason"]) == ("Failed", "ArgumentsTooLarge")


async def test_a_retry_that_finds_an_entry_deleted_goes_on_without_it(operator: Operator) -> None:
    """The namespace controller deletes entries while a person retries a saga halted on them (CI:
    the retry's write of the entry's status met a 404): the entry is reported lost and the saga
    goes on; its driver does not stop as if the saga were gone, leaving the retry unanswered."""
    saga = operator.saga("s", outcome="Abort")
    operator.entry(saga, 1, compensation={"function": "nowhere"})
    assert (await operator.drive("s")).status.phase == "Halted"
    await operator.kube.patch("sagas", NS, "s", {"metadata": {"annotations": {RETRY_ANNOTATION: "released"}}})
    await operator.kube.delete("undoentries", NS, "s-1")  # the watch has not said so yet
    await operator.run_until("s", "Compensated", within=10)
    done = operator.kube.body("sagas", NS, "s")
    assert RETRY_ANNOTATION not in done["metadata"].get("annotations", {})
    assert [(e["name"], e["acknowledged"]) for e in done["status"]["lostEntries"]] == [("s-1", True)]
