"""The operator layer (driver, recorder, compensator, forwarder, ledger) on its seams: an
in-memory object store and a scripted transport. No sockets, no apiserver: what is called, in
which order, with which headers, and what is written to the ledger."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest

from tests.support.fakes import FakeKube, FakeTransport, FixedFence
from tests.support.objects import entry_body
from tests.support.waiting import eventually
from undolog import errors
from undolog.api import (
    EffectState,
    EntryState,
    EventReason,
    OmittedOutput,
    OutputOmission,
    Saga,
    SagaPhase,
    UndoEntry,
    Webhook,
)
from undolog.api.events import SUCCESSES
from undolog.calls.registry import Registry
from undolog.calls.runner import Runner
from undolog.calls.transport import PreparedCall
from undolog.calls.webhook_cache import WebhookCache
from undolog.controller import entry_proof
from undolog.controller.compensation import Compensator
from undolog.controller.concurrency import woken
from undolog.controller.context import DriverContext, SagaSlots, Slot, wait_without_slot
from undolog.controller.driver import SagaDriver
from undolog.controller.engine import Engine
from undolog.controller.entry_index import EntryIndex
from undolog.controller.entry_proof import Listed
from undolog.controller.forward import Forwarder
from undolog.controller.recorded_call import IN_FLIGHT_MARK_AFTER, CallRecorder
from undolog.controller.shard_labels import ShardLabels, filed_in
from undolog.controller.timeline import Timeline
from undolog.conventions import BUCKET_LABEL, FINALIZER, PHASE_LABEL, bucket_of, now
from undolog.decisions import phases
from undolog.decisions.lost_entries import lost_entry
from undolog.decisions.retry import CallOutcome
from undolog.decisions.sharding import Shard
from undolog.errors import CallRefusal
from undolog.kube import Body, Plural
from undolog.kube.watch import Progress
from undolog.ledger import EntryWrites, Ledger

NS = "ns"
FAST = {"backoff": {"initialMilliseconds": 1, "maxMilliseconds": 2, "maxRetries": 3}}
OK = CallOutcome(status_code=200)


@dataclass
class Operator:
    kube: FakeKube
    transport: FakeTransport
    fence: FixedFence
    context: DriverContext
    timeline: Timeline
    watched: Progress | None = None  # the entry watch's progress (None: no watch shows every entry)

    def engine(self, **options: Any) -> Engine:
        """An engine over this operator's fakes, leading (its watches not started)."""
        engine = Engine(
            self.kube,  # type: ignore[arg-type]
            self.context.ledger,
            self.context.compensator,
            self.context.forwarder,
            self.timeline,
            self.fence,
            **options,
        )
        engine.leading = True
        return engine

    def webhook(self, name: str) -> None:
        self.kube.put(
            "webhooks",
            {
                "apiVersion": "undolog.io/v1beta1",
                "kind": "Webhook",
                "metadata": {"name": name, "namespace": NS},
                "spec": {"versions": [{"name": "v1", "url": f"http://participant.test/{name}"}], "timeoutSeconds": 2},
            },
        )

    def saga(self, name: str, phase: str | None = "Active", namespace: str = NS, **spec: Any) -> Body:
        return self.kube.put(
            "sagas",
            {
                "apiVersion": "undolog.io/v1beta1",
                "kind": "Saga",
                "metadata": {"name": name, "namespace": namespace, "finalizers": [FINALIZER], "labels": {}},
                "spec": {"compensationPolicy": FAST, **spec},
                "status": {"phase": phase, "stackDepth": 0},
            },
        )

    def entry(self, saga: Body, position: int, *, indexed: bool = True, **fields: Any) -> Body:
        body = entry_body(saga["metadata"]["name"], position, owner_uid=saga["metadata"]["uid"], **fields)
        stored = self.kube.put("undoentries", body)
        if indexed:  # seen by the watch; an entry that is not, is one the watch lags behind on
            self.context.index.keep(UndoEntry.model_validate(stored))
        return stored

    async def drive(self, name: str, *, listed: Body | None = None) -> Saga:
        """One reconcile of the saga's driver, to the point where it would wait; `listed`: the
        saga as the engine listed it on taking charge, just before its entries."""
        driver = SagaDriver(self.context, NS, name)
        if listed is not None:
            driver.listed = Listed(listed["metadata"]["resourceVersion"], now())
        await driver.reconcile()
        await self.timeline.stop(drain_seconds=1)
        self.timeline.start()
        return Saga.model_validate(self.kube.body("sagas", NS, name))

    async def run_until(self, name: str, phase: str, within: float) -> None:
        """The saga's driver as the engine runs it (conflicts, a Lease in doubt and all), until
        the saga reaches `phase`; then it is stopped."""
        driver = SagaDriver(self.context, NS, name)
        driver.task = asyncio.create_task(driver.run())

        async def seen() -> str:
            return str(self.kube.body("sagas", NS, name)["status"]["phase"])

        await eventually(seen, lambda now: now == phase, within, f"saga {name} {phase}")
        driver.notify(None)
        await driver.task

    def watch_showing_entry_writes(self) -> Progress:
        """An entry watch that is never behind: each entry write's echo is applied as it is made."""
        progress = self.watched = Progress()
        plain = self.kube.patch_status

        async def echoed(plural: Plural, namespace: str, name: str, patch: Body) -> Body:
            written = await plain(plural, namespace, name, patch)
            if plural == "undoentries":
                progress.advance(written["metadata"]["resourceVersion"])
            return written

        self.kube.patch_status = echoed  # type: ignore[method-assign]
        return progress

    def entry_lists(self) -> int:
        return sum(1 for r in self.kube.requests if r == ("list", "undoentries"))

    def saga_write_lost_once(self, when: Callable[[Body], bool] = lambda patch: True) -> list[str]:
        """The first saga status write whose patch matches `when` loses to another writer (409);
        the returned list names the saga it happened to."""
        plain = self.kube.patch_status
        conflicts: list[str] = []

        async def lost_once(plural: Plural, namespace: str, name: str, patch: Body) -> Body:
            if plural == "sagas" and when(patch) and not conflicts:
                conflicts.append(name)
                raise errors.Conflict("the object has been modified", status=409)
            return await plain(plural, namespace, name, patch)

        self.kube.patch_status = lost_once  # type: ignore[method-assign]
        return conflicts

    def state(self, name: str) -> tuple[str, str]:
        body = self.kube.body("undoentries", NS, name)
        return body["status"].get("effect", "Pending"), body["status"].get("state", "Pending")

    def undone(self) -> list[int]:
        """Positions compensated, in the order the calls were sent."""
        return [c.body["n"] for c in self.transport.sent if c.target.url.endswith("/undo")]


@pytest.fixture
async def operator() -> AsyncIterator[Operator]:
    kube, transport, fence = FakeKube(), FakeTransport(), FixedFence()
    ledger = Ledger(kube)
    timeline = Timeline(kube)
    timeline.start()
    runner = Runner(transport, fence, rng=random.Random(1), sleep=wait_without_slot)
    recorder = CallRecorder(ledger, Registry(ledger), runner, timeline)
    context = DriverContext(
        ledger=ledger,
        timeline=timeline,
        index=EntryIndex(),
        compensator=Compensator(recorder),
        forwarder=Forwarder(recorder),
        slots=SagaSlots(10),
        phase_changed=lambda saga: None,
        fence=fence,
        entries_seen=lambda namespace: None,
    )
    harness = Operator(kube, transport, fence, context, timeline)
    context.entries_seen = lambda namespace: harness.watched
    harness.webhook("undo")
    yield harness
    await timeline.stop(drain_seconds=1)


async def test_an_aborted_saga_is_compensated_newest_first_with_the_protocols_headers(operator: Operator) -> None:
    saga = operator.saga("s", outcome="Abort")
    for position in (1, 2, 3):
        operator.entry(saga, position)
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
    plain, refused, older_left = operator.kube.patch_status, asyncio.Event(), asyncio.Event()
    lost: list[str] = []

    async def newest_changed_meanwhile(plural: Plural, namespace: str, name: str, patch: Body) -> Body:
        if name == "s-3" and patch.get("status", {}).get("state") == "Compensated" and not lost:
            lost.append(name)
            await plain(plural, namespace, name, {"status": {"state": "Running"}})  # the other writer
            refused.set()
        return await plain(plural, namespace, name, patch)

    async def all_three_at_the_participant(call: PreparedCall) -> None:
        async with asyncio.timeout(5):
            if call.body["n"] == 3:  # its outcome is refused only once the older two have left
                await older_left.wait()
            elif not refused.is_set():
                if len(operator.transport.sent) == 3:
                    older_left.set()
                await refused.wait()

    operator.kube.patch_status = newest_changed_meanwhile  # type: ignore[method-assign]
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
    saga = operator.saga("s", outcome="Abort")
    operator.entry(saga, 1)
    operator.entry(saga, 2, indexed=False)
    done = await operator.drive("s")
    assert operator.undone() == [2, 1]
    assert done.status.compensated_count == 2
    lists = [r for r in operator.kube.requests if r == ("list", "undoentries")]
    assert len(lists) == 2  # before the first call, and before declaring it Compensated


async def test_the_entry_watch_past_the_last_write_proves_the_saga_compensated_without_a_second_list(
    operator: Operator,
) -> None:
    operator.watch_showing_entry_writes()
    saga = operator.saga("s", outcome="Abort")
    for position in (1, 2, 3):
        operator.entry(saga, position)
    done = await operator.drive("s")
    assert done.status.phase == "Compensated"
    assert operator.undone() == [3, 2, 1]
    assert operator.entry_lists() == 1  # before the first call only


async def test_a_watch_that_does_not_reach_the_last_write_is_not_taken_as_proof(
    operator: Operator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The watch is stuck (an outage) while an entry is registered during the compensation: the
    driver lists instead, finds it and compensates it before the saga is done."""
    monkeypatch.setattr(entry_proof, "WATCH_PROOF_WAIT", 0.05)
    operator.watched = Progress()
    saga = operator.saga("s", outcome="Abort")
    operator.entry(saga, 1)

    def register_late(call: PreparedCall) -> None:
        if not operator.transport.sent[:-1]:
            operator.entry(saga, 2, indexed=False)

    operator.transport.on_send = register_late
    done = await operator.drive("s")
    assert done.status.phase == "Compensated"
    assert sorted(operator.undone()) == [1, 2]
    assert operator.entry_lists() == 3  # before the first call, then twice more before Compensated


async def test_another_sagas_entry_write_echoed_by_the_watch_proves_before_a_slow_list(
    operator: Operator,
) -> None:
    """Sagas failing together: their LISTs wait for the apiserver's cache (up to 100 ms), while
    another saga's call outcome, written after this saga's proof began, comes back on the entry
    watch within milliseconds. Its echo proves the entries as a LIST sent then would: the first
    compensation leaves while the LIST is still unanswered."""
    operator.watch_showing_entry_writes()
    other = operator.saga("other", outcome="Abort")
    written = UndoEntry.model_validate(operator.entry(other, 1))
    saga = operator.saga("s", outcome="Abort")
    for position in (1, 2):
        operator.entry(saga, position)
    answer = asyncio.Event()
    plain = operator.kube.list

    async def slow_list(plural: Plural, namespace: str | None = None, **selectors: Any) -> list[Body]:
        listed = await plain(plural, namespace, **selectors)  # what the apiserver had when asked
        await answer.wait()
        return listed

    operator.kube.list = slow_list  # type: ignore[method-assign]
    driving = asyncio.create_task(operator.drive("s"))

    async def lists() -> int:
        return operator.entry_lists()

    async def undone() -> list[int]:
        return operator.undone()

    await eventually(lists, lambda sent: sent == 1, 5, "the proof's LIST sent")
    assert operator.transport.sent == []  # nothing leaves before a proof
    ledger = operator.context.ledger
    await ledger.write_entry_status(written, written.status.model_copy(update={"state": EntryState.RUNNING}))
    called = await eventually(undone, bool, 5, "a compensation called")
    assert called[0] == 2  # newest first, while the LIST is still unanswered
    answer.set()  # the LIST answers at last, and nobody reads it
    done = await driving
    assert done.status.phase == "Compensated"
    assert operator.undone() == [2, 1]


async def test_an_entry_write_sent_before_the_proof_began_proves_nothing() -> None:
    """Only a write sent after the mark comes after every write acknowledged before it; one
    already on its way when the proof began may carry a revision below an entry registered
    meanwhile. A write in another namespace is in another watch's stream."""
    writes = EntryWrites()
    sent_early = asyncio.Event()

    async def answered(version: str, gate: asyncio.Event | None = None) -> Body:
        if gate is not None:
            await gate.wait()
        return {"metadata": {"resourceVersion": version}}

    early = asyncio.create_task(writes.written(NS, answered("5", sent_early)))
    await asyncio.sleep(0)  # on its way
    waiting = asyncio.create_task(writes.next_after(writes.mark(), NS))
    sent_early.set()
    await early
    await writes.written("elsewhere", answered("6"))
    await asyncio.sleep(0)
    assert not waiting.done()
    await writes.written(NS, answered("7"))
    assert await waiting == 7


async def test_the_listing_taken_on_taking_charge_proves_the_copy_listed_before_it(operator: Operator) -> None:
    operator.watch_showing_entry_writes()
    saga = operator.saga("s", outcome="Abort")
    for position in (1, 2):
        operator.entry(saga, position)
    done = await operator.drive("s", listed=saga)
    assert done.status.phase == "Compensated"
    assert operator.undone() == [2, 1]
    assert operator.entry_lists() == 0


async def test_a_saga_aborted_before_its_first_status_is_resumed_without_a_list_or_an_active_write(
    operator: Operator,
) -> None:
    operator.watch_showing_entry_writes()
    saga = operator.saga("s", phase=None, outcome="Abort")  # aborted while no operator ran
    for position in (1, 2, 3):
        operator.entry(saga, position)
    phases_written: list[str] = []
    plain = operator.kube.patch_status

    async def recorded(plural: Plural, namespace: str, name: str, patch: Body) -> Body:
        if plural == "sagas":
            phases_written.append(patch["status"]["phase"])
        return await plain(plural, namespace, name, patch)

    operator.kube.patch_status = recorded  # type: ignore[method-assign]
    done = await operator.drive("s", listed=saga)
    assert done.status.phase == "Compensated"
    assert done.status.start_time == done.metadata.creation_timestamp
    assert operator.undone() == [3, 2, 1]
    assert phases_written == ["Compensating", "Compensated"]
    assert operator.entry_lists() == 0


async def test_the_finalizer_written_on_the_listed_copy_keeps_the_listing_as_proof(operator: Operator) -> None:
    """A saga aborted before any operator saw it has no finalizer: the one written on it
    changes nothing the listing proved (written on condition of the listed copy)."""
    operator.watch_showing_entry_writes()
    saga = operator.saga("s", phase=None, outcome="Abort")
    saga["metadata"]["finalizers"] = []
    saga = operator.kube.put("sagas", saga)
    operator.entry(saga, 1)
    driver = SagaDriver(operator.context, NS, "s")
    driver.listed = Listed(saga["metadata"]["resourceVersion"], now())
    await driver.reconcile()
    assert operator.kube.body("sagas", NS, "s")["status"]["phase"] == "Compensated"
    assert operator.entry_lists() == 0


async def test_a_deadline_passed_after_the_listing_is_proven_by_a_list_of_its_own(operator: Operator) -> None:
    operator.watch_showing_entry_writes()
    saga = operator.saga("s", activeDeadlineSeconds=1)
    created = now() - timedelta(seconds=10)
    saga["metadata"]["creationTimestamp"] = created.isoformat()
    saga = operator.kube.put("sagas", saga)
    operator.entry(saga, 1)
    driver = SagaDriver(operator.context, NS, "s")
    driver.listed = Listed(saga["metadata"]["resourceVersion"], created + timedelta(seconds=0.5))  # before it
    await driver.reconcile()
    assert operator.kube.body("sagas", NS, "s")["status"]["phase"] == "Compensated"
    assert operator.entry_lists() == 1


async def test_a_failure_newer_than_the_listed_copy_is_proven_by_a_list_of_its_own(operator: Operator) -> None:
    listed = operator.saga("s")
    operator.watch_showing_entry_writes()
    operator.entry(listed, 1)
    aborted = operator.kube.put("sagas", {**listed, "spec": {**listed["spec"], "outcome": "Abort"}})  # since
    operator.entry(aborted, 2, indexed=False)  # not delivered yet: only a LIST shows it
    await operator.drive("s", listed=listed)
    assert operator.undone() == [2, 1]
    assert operator.entry_lists() == 1


async def test_a_driver_holds_the_newest_copy_of_its_saga_as_it_was(operator: Operator) -> None:
    """Memory: the copy a driver holds is kept as JSON; what it gives back equals what it was given."""
    saga = operator.saga("s", outcome="Abort")
    operator.entry(saga, 1)
    done = await operator.drive("s")  # conditions, times, counters: a full status
    driver = SagaDriver(operator.context, NS, "s")

    def at(version: str) -> Saga:
        return done.model_copy(update={"metadata": done.metadata.model_copy(update={"resource_version": version})})

    driver.notify(done)  # out of its slot: held as JSON
    assert driver.copy.as_json
    driver.notify(at("1"))  # an older event arriving late
    assert driver.latest == done
    newer = at("99999999")
    driver.notify(newer)
    driver.copy.work(True)  # in its slot: parsed
    assert not driver.copy.as_json
    assert driver.latest == newer
    assert driver.copy.keep_newest(at("not-a-number")) is None  # cannot be ordered: read again
    assert driver.latest is None


async def test_an_entry_registered_during_compensation_is_compensated_before_the_saga_is_done(
    operator: Operator,
) -> None:
    saga = operator.saga("s", outcome="Abort")
    operator.entry(saga, 1)

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
    saga = operator.saga("s", outcome="Abort")
    operator.entry(saga, 1)
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
        error="127.0.0.1:80 is refused by the operator's egress policy", refusal=CallRefusal.TARGET_REFUSED
    )
    operator.transport.script("/undo", refused)
    saga = operator.saga("s", outcome="Abort")
    operator.entry(saga, 1)
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


async def test_a_replaced_leader_sends_nothing(operator: Operator) -> None:
    operator.fence.leading = False
    saga = operator.saga("s", outcome="Abort")
    operator.entry(saga, 1)
    with pytest.raises(errors.NotLeading):
        await operator.drive("s")
    assert operator.transport.sent == []
    assert operator.kube.body("sagas", NS, "s")["status"]["phase"] == "Active"


async def test_orchestrated_steps_run_in_order_with_outputs_flowing(operator: Operator) -> None:
    operator.webhook("create")
    operator.webhook("grant")
    operator.transport.script("/create", CallOutcome(status_code=200, output={"user_id": "u-7"}))
    steps = [
        {"name": "create", "action": {"function": "create"}, "compensation": {"function": "undo"}},
        {
            "name": "grant",
            "action": {"function": "grant", "args": {"user": "${steps.create.output.user_id}"}},
            "compensation": {"function": "undo"},
        },
    ]
    saga = operator.saga("o", steps=steps)
    done = await operator.drive("o")
    assert done.status.phase == "Completed"
    assert operator.transport.paths() == ["/create", "/grant"]
    assert operator.transport.sent[1].body == {"user": "u-7"}
    assert operator.transport.sent[0].headers["Idempotency-Key"] == f"{saga['metadata']['uid']}:create:fwd"
    assert operator.kube.body("undoentries", NS, "o-1")["status"]["output"] == {"user_id": "u-7"}


async def test_a_null_in_an_output_is_kept_and_flows_to_the_next_step(operator: Operator) -> None:
    """A merge patch takes a null inside an object as "delete the key": `"parent": null` was
    stored without `parent`, and the next step's reference to it failed the saga."""
    operator.webhook("create")
    operator.webhook("grant")
    operator.transport.script("/create", CallOutcome(status_code=200, output={"user_id": "u-7", "parent": None}))
    steps = [
        {"name": "create", "action": {"function": "create"}, "compensation": {"function": "undo"}},
        {
            "name": "grant",
            "action": {"function": "grant", "args": {"parent": "${steps.create.output.parent}"}},
            "compensation": {"function": "undo"},
        },
    ]
    operator.saga("o", steps=steps)
    done = await operator.drive("o")
    assert done.status.phase == "Completed"
    assert operator.transport.sent[1].body == {"parent": None}
    assert operator.kube.body("undoentries", NS, "o-1")["status"]["output"] == {"user_id": "u-7", "parent": None}


async def test_a_step_whose_call_never_left_is_not_compensated(operator: Operator) -> None:
    operator.webhook("create")
    steps = [
        {"name": "create", "action": {"function": "create"}, "compensation": {"function": "undo", "args": {"n": 1}}},
        {
            "name": "grant",
            "action": {"function": "unregistered"},
            "compensation": {"function": "undo", "args": {"n": "${steps.grant.output.id}"}},
        },
    ]
    operator.saga("o", steps=steps)
    done = await operator.drive("o")
    assert (done.status.phase, done.status.failed_step) == ("Compensated", "grant")
    assert operator.transport.paths() == ["/create", "/undo"]  # never {"n": null} for the step never sent
    assert operator.undone() == [1]
    never = operator.kube.body("undoentries", NS, "o-2")["status"]
    assert (never["effect"], never["state"], never["reason"]) == ("NotSent", "Skipped", "NotSent")
    assert "no Webhook 'unregistered'" in never["skipReason"]
    assert done.status.compensated_count == 2


async def test_a_target_refused_on_the_first_send_is_never_sent(operator: Operator) -> None:
    operator.webhook("create")
    refused = CallOutcome(error="127.0.0.1:80 is refused by the egress policy", refusal=CallRefusal.TARGET_REFUSED)
    operator.transport.script("/create", refused)
    steps = [{"name": "create", "action": {"function": "create"}, "compensation": {"function": "undo"}}]
    operator.saga("o", steps=steps)
    done = await operator.drive("o")
    assert done.status.phase == "Compensated"
    assert operator.transport.paths() == ["/create"]  # refused before any byte left; nothing to undo
    assert operator.state("o-1") == ("NotSent", "Skipped")


async def test_a_step_registered_before_a_crash_may_have_been_sent_so_it_is_compensated(operator: Operator) -> None:
    steps = [{"name": "create", "action": {"function": "gone"}, "compensation": {"function": "undo", "args": {"n": 1}}}]
    saga = operator.saga("o", steps=steps)
    # An earlier operator registered the step and may have sent it before it died; the function is gone now.
    operator.entry(saga, 1, effect="Pending", step="create", compensation={"function": "undo", "args": {"n": 1}})
    done = await operator.drive("o")
    assert done.status.phase == "Compensated"
    assert operator.state("o-1") == ("Failed", "Compensated")
    assert operator.undone() == [1]


async def test_an_answer_that_is_not_kept_as_output_says_why(operator: Operator) -> None:
    operator.webhook("create")
    omitted = OmittedOutput(reason=OutputOmission.ANSWER_NOT_JSON, message="not a JSON object (text/html, 9 bytes)")
    operator.transport.script("/create", CallOutcome(status_code=200, omitted=omitted))
    steps = [{"name": "create", "action": {"function": "create"}, "compensation": {"function": "undo"}}]
    operator.saga("o", steps=steps)
    done = await operator.drive("o")
    assert done.status.phase == "Completed"
    status = operator.kube.body("undoentries", NS, "o-1")["status"]
    assert "output" not in status
    assert status["outputOmitted"]["reason"] == "AnswerNotJson"


async def test_a_step_the_api_refuses_to_register_fails_the_saga_instead_of_retrying(operator: Operator) -> None:
    operator.webhook("create")
    operator.kube.refuse[("create", "undoentries")] = errors.Invalid("spec.saga: Too long", status=422)
    steps = [{"name": "create", "action": {"function": "create"}, "compensation": {"function": "undo"}}]
    operator.saga("o", steps=steps)
    done = await operator.drive("o")
    assert (done.status.phase, done.status.reason) == ("Compensated", "Compensated")
    succeeded = next(c for c in done.status.conditions if c.type == "Succeeded")
    assert succeeded.reason == "StepNotRegistered"
    assert "spec.saga: Too long" in succeeded.message
    assert operator.transport.sent == []


async def test_an_entry_registered_after_completion_is_settled_and_said(operator: Operator) -> None:
    saga = operator.saga("c", outcome="Commit")
    operator.entry(saga, 1)
    done = await operator.drive("c")
    assert (done.status.phase, done.status.top_position) == ("Completed", 1)
    operator.entry(saga, 2)
    await operator.drive("c")
    late = operator.kube.body("undoentries", NS, "c-2")["status"]
    assert (late["state"], late["reason"]) == ("Skipped", "RegisteredAfterCompletion")
    assert operator.state("c-1") == ("Committed", "Pending")  # the committed step is left alone
    assert any(reason == "EntryAfterCompletion" for _, reason, _ in operator.kube.events)
    assert operator.transport.sent == []


async def test_calls_made_together_give_up_and_take_back_one_slot() -> None:
    slots = SagaSlots(2)
    async with Slot(slots, NS):
        await asyncio.gather(wait_without_slot(0.01), wait_without_slot(0.02))  # two calls of one saga retrying
        assert slots.locked() is False  # it holds exactly one of the two
    await asyncio.wait_for(asyncio.gather(slots.acquire(NS), slots.acquire(NS)), 1)  # both free again: none leaked


async def test_a_free_slot_goes_to_the_namespaces_in_turn_and_none_is_lost_to_a_cancelled_waiter() -> None:
    """Drivers of a busy namespace woken one after another (a change, a timer, a retry pause
    ending) asked the slots before another namespace's driver did: first come first served,
    that one waited behind all of them."""
    slots = SagaSlots(1)
    await slots.acquire("busy")
    order: list[str] = []

    async def take(namespace: str, tag: str) -> None:
        await slots.acquire(namespace)
        order.append(tag)

    waiting = [asyncio.create_task(take("busy", f"busy-{i}")) for i in range(3)]
    gone = asyncio.create_task(take("gone", "never"))
    waiting.append(asyncio.create_task(take("quiet", "quiet")))
    await asyncio.sleep(0)
    gone.cancel()
    for _ in range(4):
        slots.release()
        await asyncio.sleep(0)
    assert order == ["busy-0", "quiet", "busy-1", "busy-2"]
    late = asyncio.create_task(take("late", "late"))
    await asyncio.sleep(0)
    slots.release()  # busy-2's, granted to `late`, cancelled before it runs: the slot is free again
    late.cancel()
    await asyncio.gather(late, gone, return_exceptions=True)
    assert slots.free == 1
    await asyncio.gather(*waiting)


async def test_a_saga_waiting_to_retry_gives_its_slot_to_another(operator: Operator) -> None:
    """One slot; saga a's participant asks it to come back in 2 s. Meanwhile saga b, which
    needs the slot, is compensated: a waiting saga holds no slot."""
    operator.context.slots = SagaSlots(1)
    operator.webhook("slow")
    operator.transport.script("/slow", CallOutcome(status_code=429, error="HTTP 429", retry_after="2"))
    a = operator.saga("a", outcome="Abort")
    operator.entry(a, 1, compensation={"function": "slow"})
    b = operator.saga("b", outcome="Abort")
    operator.entry(b, 1)
    first_call = asyncio.Event()
    operator.transport.on_send = lambda call: first_call.set()
    waiting = asyncio.create_task(SagaDriver(operator.context, NS, "a").run())
    await asyncio.wait_for(first_call.wait(), timeout=5)
    began = asyncio.get_running_loop().time()
    await asyncio.wait_for(SagaDriver(operator.context, NS, "b").run(), timeout=1.5)
    assert asyncio.get_running_loop().time() - began < 1.5
    assert operator.kube.body("sagas", NS, "b")["status"]["phase"] == "Compensated"
    await asyncio.wait_for(waiting, timeout=5)
    assert operator.kube.body("sagas", NS, "a")["status"]["phase"] == "Compensated"
    assert operator.context.slots.free == 1  # every slot given back


async def test_a_driver_that_finds_the_lease_in_doubt_waits_and_carries_on(operator: Operator) -> None:
    """A late renewal under load puts the Lease in doubt for a moment: the driver sends nothing
    meanwhile, and neither gives its saga up (no one else would drive it)."""
    operator.fence.leading = False
    saga = operator.saga("s", outcome="Abort")
    operator.entry(saga, 1)
    driving = asyncio.create_task(SagaDriver(operator.context, NS, "s").run())
    await asyncio.sleep(0.3)  # a moment in doubt: nothing may be sent
    assert operator.transport.sent == []
    assert not driving.done()
    operator.fence.leading = True
    await asyncio.wait_for(driving, timeout=5)
    assert operator.kube.body("sagas", NS, "s")["status"]["phase"] == "Compensated"
    assert len(operator.transport.sent) == 1


async def test_an_unexpected_error_is_said_on_its_saga_and_retried_not_the_end_of_its_driver(
    operator: Operator, caplog: pytest.LogCaptureFixture
) -> None:
    """A defect, or input nobody foresaw, raised inside a reconcile (here by the transport): the
    saga says so in a Warning Event, the log has the traceback, and the driver tries again with
    backoff. Before, the driver's task ended with it and the saga stayed Compensating in silence."""
    saga = operator.saga("s", outcome="Abort")
    operator.entry(saga, 1)
    raised: list[PreparedCall] = []

    def defect(call: PreparedCall) -> None:
        if not raised:
            raised.append(call)
            raise RuntimeError("a defect nobody foresaw")

    operator.transport.on_send = defect
    driving = asyncio.create_task(SagaDriver(operator.context, NS, "s").run())
    await asyncio.wait_for(driving, timeout=5)  # the first retry comes after 1 s
    assert operator.kube.body("sagas", NS, "s")["status"]["phase"] == "Compensated"
    assert len(operator.transport.sent) == 2  # sent again under the same key
    assert len({c.headers["Idempotency-Key"] for c in operator.transport.sent}) == 1
    await operator.timeline.stop(drain_seconds=1)
    said = [message for _, reason, message in operator.kube.events if reason == EventReason.OPERATOR_ERROR]
    assert said == ["unexpected RuntimeError in the operator: a defect nobody foresaw; retrying with backoff"]
    assert any(r.exc_info and r.exc_info[0] is RuntimeError for r in caplog.records)


async def test_a_rewind_undoes_the_entries_above_and_hands_the_saga_back(operator: Operator) -> None:
    saga = operator.saga("r")
    for position in range(1, 6):
        operator.entry(saga, position)
    await operator.kube.patch("sagas", NS, "r", {"spec": {"rewind": {"toPosition": 2, "reason": "bad plan"}}})
    back = await operator.drive("r")
    assert (back.status.phase, back.status.reason) == ("Active", "Rewound")
    assert back.status.rewind is not None
    assert (back.status.rewind.state, back.status.rewind.undone) == ("Done", 3)
    assert operator.undone() == [5, 4, 3]
    for position in (3, 4, 5):
        assert operator.kube.body("undoentries", NS, f"r-{position}")["status"]["rewoundAt"]
    assert [operator.state(f"r-{p}")[1] for p in (1, 2)] == ["Pending", "Pending"]
    # The agent goes on (a new entry above), then commits; the same request is not carried out again.
    operator.entry(saga, 6)
    await operator.kube.patch("sagas", NS, "r", {"spec": {"outcome": "Commit"}})
    done = await operator.drive("r")
    assert done.status.phase == "Completed"
    assert operator.undone() == [5, 4, 3]
    phases_seen = [reason for _, reason, _ in operator.kube.events if reason in ("Rewinding", "Active")]
    assert phases_seen[-2:] == ["Rewinding", "Active"]


async def test_a_rewound_orchestrated_saga_runs_its_later_steps_again_with_new_keys(operator: Operator) -> None:
    for function in ("a", "b", "c"):
        operator.webhook(function)
    steps = [
        {"name": name, "action": {"function": name}, "compensation": {"function": "undo", "args": {"n": n}}}
        for n, name in enumerate(("a", "b", "c"), start=1)
    ]
    saga = operator.saga("o", steps=steps)
    for position, name in enumerate(("a", "b"), start=1):  # a and b ran; c has not yet
        operator.entry(saga, position, step=name, compensation={"function": "undo", "args": {"n": position}})
    await operator.kube.patch("sagas", NS, "o", {"spec": {"rewind": {"toPosition": 1, "reason": "redo b"}}})
    done = await operator.drive("o")
    assert done.status.phase == "Completed"
    assert operator.transport.paths() == ["/undo", "/b", "/c"]  # b undone, then b and c run
    uid = saga["metadata"]["uid"]
    keys = [call.headers["Idempotency-Key"] for call in operator.transport.sent[1:]]
    assert keys == [f"{uid}:b@3:fwd", f"{uid}:c:fwd"]  # b again: a new effect under a new key
    assert operator.kube.body("undoentries", NS, "o-2")["status"]["rewoundAt"]
    assert operator.state("o-3") == ("Committed", "Pending")


async def test_a_rewind_that_halts_resumes_rewinding_on_retry(operator: Operator) -> None:
    operator.transport.script("/undo", CallOutcome(status_code=400, output={"error": "no"}))
    saga = operator.saga("h")
    for position in (1, 2, 3):
        operator.entry(saga, position)
    await operator.kube.patch("sagas", NS, "h", {"spec": {"rewind": {"toPosition": 1, "reason": "r"}}})
    halted = await operator.drive("h")
    assert (halted.status.phase, halted.status.reason) == ("Halted", "CompensationFailed")
    await operator.kube.patch("sagas", NS, "h", {"metadata": {"annotations": {"undolog.io/retry": "fixed"}}})
    back = await operator.drive("h")
    assert (back.status.phase, back.status.reason) == ("Active", "Rewound")
    assert operator.undone() == [3, 3, 2]
    assert operator.state("h-1") == ("Committed", "Pending")


async def test_a_rewind_past_the_committed_pivot_is_refused(operator: Operator) -> None:
    for function in ("pay", "ship"):
        operator.webhook(function)
    steps = [
        {"name": "pay", "type": "Pivot", "action": {"function": "pay"}},
        {"name": "ship", "type": "Retriable", "action": {"function": "ship"}},
    ]
    saga = operator.saga("p", steps=steps)
    operator.entry(saga, 1, step="pay", compensation=None)
    await operator.kube.patch_status("sagas", NS, "p", {"status": {"pivotCommitted": True}})
    await operator.kube.patch("sagas", NS, "p", {"spec": {"rewind": {"toPosition": 0, "reason": "undo all"}}})
    done = await operator.drive("p")
    assert done.status.rewind is not None
    assert done.status.rewind.state == "Refused"
    assert "would undo the committed Pivot step 'pay' (position 1)" in (done.status.rewind.message or "")
    assert "/undo" not in operator.transport.paths()


async def test_successes_the_status_records_are_not_events_unless_asked_for(operator: Operator) -> None:
    """A compensation of 3 entries posts one Event by default, its Failed Warning: the calls and
    the end are in the status with their times. Every Warning and other phase change stays."""
    quiet = Timeline(operator.kube, quiet=SUCCESSES)
    quiet.start()
    saga = Saga.model_validate(operator.saga("q"))
    quiet.record(saga, SagaPhase.FAILED, "Aborted: spec.outcome is Abort; undoing 3 entries", warning=True)
    quiet.record(saga, EventReason.ENTRY_COMPENSATED, "q-1: HTTP 200")
    quiet.record(saga, EventReason.COMPENSATION_FAILED, "q-2: HTTP 400", warning=True)
    quiet.record(saga, SagaPhase.HALTED, "CompensationFailed: q-2", warning=True)
    quiet.record(saga, SagaPhase.ACTIVE, "Rewound: back to position 1")
    quiet.record(saga, SagaPhase.COMPENSATED, "Compensated: 2 entries")
    quiet.record(saga, SagaPhase.COMPLETED, "Committed")
    await quiet.stop(drain_seconds=1)
    assert [reason for _, reason, _ in operator.kube.events] == ["Failed", "CompensationFailed", "Halted", "Active"]


def cached(operator: Operator, url: str) -> WebhookCache:
    """A Webhook cache holding `undo` at `url`, whatever the API holds (a watch lagging or not)."""
    cache = WebhookCache(operator.kube, [NS])  # type: ignore[arg-type]
    body = operator.kube.body("webhooks", NS, "undo")
    stale = {**body, "spec": {**body["spec"], "versions": [{"name": "v1", "url": url}]}}
    cache.webhooks[(NS, "undo")] = Webhook.model_validate(stale)
    operator.context.compensator.recorder.registry.cache = cache
    return cache


async def test_compensation_targets_come_from_the_webhook_cache_without_a_read(operator: Operator) -> None:
    cached(operator, "http://participant.test/undo")
    saga = operator.saga("s", outcome="Abort")
    for position in (1, 2, 3):
        operator.entry(saga, position)
    done = await operator.drive("s")
    assert done.status.phase == "Compensated"
    assert operator.undone() == [3, 2, 1]
    assert ("get", "webhooks") not in operator.kube.requests


async def test_a_call_failed_on_a_stale_cached_webhook_is_made_again_at_the_apis_target(operator: Operator) -> None:
    """A person fixed the Webhook; the cache has not heard yet. The failure is checked against
    the API before it is recorded, and the call goes to the fixed target: no halt."""
    cached(operator, "http://participant.test/old")
    operator.transport.script("/old", CallOutcome(status_code=404, error="HTTP 404: no such route"))
    saga = operator.saga("s", outcome="Abort")
    operator.entry(saga, 1)
    done = await operator.drive("s")
    assert done.status.phase == "Compensated"
    assert operator.transport.paths() == ["/old", "/undo"]
    assert [c.headers["Undolog-Attempt"] for c in operator.transport.sent] == ["1", "2"]
    keys = {c.headers["Idempotency-Key"] for c in operator.transport.sent}
    assert len(keys) == 1
    entry = operator.kube.body("undoentries", NS, "s-1")["status"]
    assert [a.get("statusCode") for a in entry["attempts"]] == [404, 200]
    assert any("its Webhook changed" in message for _, _, message in operator.kube.events)


async def test_a_failure_on_a_cached_webhook_that_is_still_current_is_recorded_as_it_was(operator: Operator) -> None:
    cached(operator, "http://participant.test/undo")
    operator.transport.script("/undo", CallOutcome(status_code=400, error="HTTP 400: unknown grant"))
    saga = operator.saga("s", outcome="Abort")
    operator.entry(saga, 1)
    halted = await operator.drive("s")
    assert halted.status.phase == "Halted"
    assert operator.transport.paths() == ["/undo"]  # the API agreed with the cache: not sent again


async def test_a_driver_woken_and_cancelled_at_once_stops() -> None:
    """Stopping the engine cancels every driver while events still wake them; a cancellation
    that arrives with a wake-up must end the driver's wait (asyncio.wait_for on 3.11 returned
    normally instead, the driver looped on, and the engine never stopped)."""
    wake = asyncio.Event()
    waiting = asyncio.create_task(woken(wake, 30))
    await asyncio.sleep(0)  # the task is waiting
    wake.set()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert waiting.cancelled()


async def test_a_saga_and_entry_labelled_into_the_wrong_shard_are_filed_where_they_belong_not_driven(
    operator: Operator,
) -> None:
    """A bucket label edited by hand would put a saga in a shard whose replica lists it, while its
    entries (labelled by the SDK) are in another: that replica leaves it alone and puts the
    label right, so the replica of its real shard drives it with its entries."""
    name = next(n for n in (f"s{i}" for i in range(100)) if Shard(1, 2).owns(NS, n))
    saga = operator.saga(name, outcome="Abort")
    saga["metadata"]["labels"][BUCKET_LABEL] = str(Shard(0, 2).buckets[0])
    entry = operator.entry(saga, 1, indexed=False)
    engine = operator.engine(shard=Shard(0, 2), labels=ShardLabels(operator.context.ledger))
    engine.saga_event("MODIFIED", saga)
    assert not filed_in(engine.shard, engine.labels, UndoEntry.model_validate(entry))
    assert engine.drivers == {}
    await until_filed(operator.kube, [("sagas", name), ("undoentries", f"{name}-1")], str(bucket_of(NS, name)))
    assert operator.transport.sent == []


async def test_the_entries_of_a_finished_saga_are_let_go_until_one_changes(operator: Operator) -> None:
    """Memory: a Compensated saga's entries leave the index (a late one brings its saga back)."""
    saga = operator.saga("s", phase="Compensated")
    saga["metadata"].update(finalizers=[], labels={PHASE_LABEL: "compensated"})
    operator.entry(saga, 1, state="Compensated")
    engine = operator.engine(index=operator.context.index)
    engine.saga_event("MODIFIED", saga)
    assert engine.index.of((NS, "s")) == {}
    assert engine.drivers == {}
    # The watch's echo of an entry write made before the saga settled, arriving after it did.
    echo = UndoEntry.model_validate(operator.kube.body("undoentries", NS, "s-1"))
    engine.index.keep(echo)
    engine.entry_event((echo, False))
    assert engine.index.of((NS, "s")) == {}
    late = UndoEntry.model_validate(operator.entry(saga, 2))
    engine.entry_event((late, False))
    assert (NS, "s") in engine.drivers
    await engine.stop()


async def test_sagas_waiting_for_a_slot_wait_in_a_queue_not_as_tasks(operator: Operator) -> None:
    """Memory when an operator takes charge of thousands of sagas: with 2 slots and 20 sagas to
    compensate, never more than 2 driver tasks exist; all 20 are compensated, and every slot is
    free at the end, including those of drivers stopped before they ran."""
    slots = SagaSlots(2)
    engine = operator.engine(slots=slots)
    names = [f"s{i:02d}" for i in range(20)]
    for name in names:
        saga = operator.saga(name, outcome="Abort")
        operator.entry(saga, 1, indexed=False)
        engine.saga_event("MODIFIED", saga)
    most = 0

    async def finished() -> int:
        nonlocal most
        most = max(most, sum(1 for d in engine.drivers.values() if d.task is not None))
        return sum(operator.kube.body("sagas", NS, n).get("status", {}).get("phase") == "Compensated" for n in names)

    await eventually(finished, lambda done: done == len(names), 10, "20 sagas Compensated")
    assert most <= 2
    assert slots.free == 2
    async with Slot(slots, NS):  # one slot held elsewhere: t1 is given the other, t2 and t3 wait
        for name in ("t1", "t2", "t3"):
            engine.saga_event("MODIFIED", operator.saga(name, outcome="Abort"))
        await asyncio.sleep(0)  # the dispatcher started t1's task, which has not run yet
        assert [key[1] for key, d in engine.drivers.items() if d.task is not None] == ["t1"]
        await engine.stop()
    assert slots.free == 2
    assert engine.drivers == {}
    assert not engine.queued


async def test_a_namespace_whose_sagas_queue_behind_another_namespaces_hundreds_is_served_next(
    operator: Operator,
) -> None:
    """One tenant's 30 sagas aborted together against a slow participant fill the operator's
    slots; another tenant's saga, aborted after them, gets the next slot that frees up. In one
    queue it was compensated after all 30 (last of 31 calls)."""
    slots = SagaSlots(2)
    engine = operator.engine(slots=slots)
    calls: list[str] = []

    async def slow_for_busy(call: PreparedCall) -> None:
        calls.append(call.headers["Undolog-Saga"].split("/")[0])
        if calls[-1] == "busy":
            await asyncio.sleep(0.02)

    operator.transport.on_send = slow_for_busy
    for namespace in ("busy", "quiet"):
        operator.kube.put(
            "webhooks",
            {**operator.kube.body("webhooks", NS, "undo"), "metadata": {"name": "undo", "namespace": namespace}},
        )
    sagas = [("busy", f"b{i:02d}") for i in range(30)] + [("quiet", "q")]
    for namespace, name in sagas:
        saga = operator.saga(name, outcome="Abort", namespace=namespace)
        operator.kube.put("undoentries", entry_body(name, 1, namespace=namespace, owner_uid=saga["metadata"]["uid"]))
        engine.saga_event("MODIFIED", saga)

    async def compensated() -> int:
        return sum(
            operator.kube.body("sagas", ns, n).get("status", {}).get("phase") == "Compensated" for ns, n in sagas
        )

    await eventually(compensated, lambda done: done == len(sagas), 10, "31 sagas Compensated")
    await engine.stop()
    assert len(calls) == 31
    assert calls.index("quiet") <= 3, calls


async def until_filed(kube: FakeKube, objects: list[tuple[Plural, str]], bucket: str) -> None:
    async def filed() -> bool:
        return all(kube.body(p, NS, n)["metadata"]["labels"].get(BUCKET_LABEL) == bucket for p, n in objects)

    await eventually(filed, lambda done: done, 5, "the bucket labels put right")


async def test_a_call_whose_in_flight_mark_cannot_be_written_is_not_cut_off_and_sent_again(
    operator: Operator,
) -> None:
    """The in-flight mark is written once a call takes longer than IN_FLIGHT_MARK_AFTER; under
    load that write can time out. The call the participant already has must not be cut off for
    it (the next reconcile would send it again as the same attempt)."""
    saga = operator.saga("slow", outcome="Abort")
    operator.entry(saga, 1)

    async def slow_while_the_api_times_out(call: PreparedCall) -> None:
        operator.kube.refuse[("patch-status", "undoentries")] = errors.KubeError("the request timed out", status=504)
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
    plain = operator.kube.patch_status

    async def answered_after_the_call(plural: Plural, namespace: str, name: str, patch: Body) -> Body:
        written = await plain(plural, namespace, name, patch)
        if plural == "undoentries" and patch.get("status", {}).get("state") == "Running":
            mark_landed.set()
            await call_over.wait()
        return written

    async def over_once_marked(call: PreparedCall) -> None:
        async with asyncio.timeout(IN_FLIGHT_MARK_AFTER + 5):
            await mark_landed.wait()
        call_over.set()

    operator.kube.patch_status = answered_after_the_call  # type: ignore[method-assign]
    operator.transport.on_send = over_once_marked
    done = await operator.drive("slow")
    assert len(operator.transport.sent) == 1
    assert done.status.phase == "Compensated"
    assert operator.state("slow-1")[1] == "Compensated"


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


@pytest.mark.parametrize(
    ("queued", "at_participant", "marked"),
    [(IN_FLIGHT_MARK_AFTER + 0.3, 0.0, False), (0.0, IN_FLIGHT_MARK_AFTER + 0.3, True)],
)
async def test_only_a_call_slow_at_the_participant_is_marked_running(
    operator: Operator, queued: float, at_participant: float, marked: bool
) -> None:
    """The in-flight mark counts from when the call leaves: a call queued behind the operator's
    own (its participant's slots all taken, as at 100 sagas at once) costs no Running write."""
    saga = operator.saga("s", outcome="Abort")
    operator.entry(saga, 1)
    operator.transport.queued = queued
    states: list[str] = []
    plain = operator.kube.patch_status

    async def recorded(plural: Plural, namespace: str, name: str, patch: Body) -> Body:
        if plural == "undoentries":
            states.append(patch["status"].get("state", ""))
        return await plain(plural, namespace, name, patch)

    async def slow(call: PreparedCall) -> None:
        await asyncio.sleep(at_participant)

    operator.kube.patch_status = recorded  # type: ignore[method-assign]
    operator.transport.on_send = slow
    done = await operator.drive("s")
    assert done.status.phase == "Compensated"
    assert states == (["Running", "Compensated"] if marked else ["Compensated"])


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


async def test_no_progress_write_while_every_slot_is_taken(operator: Operator, monkeypatch: pytest.MonkeyPatch) -> None:
    """A slow saga shows its progress (compensatedCount) while it runs, but not while every slot
    is taken: then the operator is at its limit (thousands of sagas resuming), and a progress
    write per saga only slowed them all."""
    monkeypatch.setattr("undolog.controller.saga_status.COUNTER_INTERVAL", 0.0)  # progress after every entry
    writes: list[Body] = []
    plain = operator.kube.patch_status

    async def recorded(plural: Plural, namespace: str, name: str, patch: Body) -> Body:
        if plural == "sagas":
            writes.append(patch["status"])
        return await plain(plural, namespace, name, patch)

    operator.kube.patch_status = recorded  # type: ignore[method-assign]
    for name, crowded in (("free", False), ("crowded", True)):
        saga = operator.saga(name, outcome="Abort")
        for position in (1, 2, 3):
            operator.entry(saga, position)
        operator.context.slots = SagaSlots(1 if crowded else 2)
        writes.clear()
        await operator.run_until(name, "Compensated", within=5)
        progress = [] if crowded else ["Compensating", "Compensating"]  # after entries 3 and 2
        assert [w.get("phase") for w in writes] == ["Compensating", *progress, "Compensated"]


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
    saga = operator.saga("s", outcome="Abort")
    operator.entry(saga, 1)

    async def cut_once(call: PreparedCall) -> None:
        if len(operator.transport.sent) == 1:
            await asyncio.sleep(IN_FLIGHT_MARK_AFTER + 0.3)  # marked Running meanwhile
            raise errors.NotLeading("the Lease is in doubt")

    operator.transport.on_send = cut_once
    await operator.run_until("s", "Compensated", within=10)
    assert [c.headers["Undolog-Attempt"] for c in operator.transport.sent] == ["1", "1"]


def fresh_orchestrated(operator: Operator, name: str, functions: list[str]) -> Body:
    """An orchestrated saga as `kubectl apply` leaves it: just created, no status, no finalizer."""
    steps = [
        {"name": f"step{i}", "action": {"function": function}, "compensation": {"function": "undo"}}
        for i, function in enumerate(functions, start=1)
    ]
    for function in set(functions):
        operator.webhook(function)
    return operator.kube.put(
        "sagas",
        {
            "apiVersion": "undolog.io/v1beta1",
            "kind": "Saga",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"compensationPolicy": FAST, "steps": steps},
        },
    )


async def test_a_quick_orchestrated_saga_costs_two_writes_a_step_and_three_of_its_own(operator: Operator) -> None:
    """Its steps run before Active is written: Completed is its first status, and no Event is
    posted for a start nobody could have watched. Kept (no TTL), its entries' field owners are
    dropped as it finishes: one write each, after the work."""
    created = fresh_orchestrated(operator, "o", ["work", "work", "work"])
    operator.kube.requests.clear()
    done = await operator.drive("o")
    assert done.status.phase == "Completed"
    writes = [r for r in operator.kube.requests if r[0] in ("create", "patch", "patch-status")]
    per_step = [("create", "undoentries"), ("patch-status", "undoentries")]
    owners = [("patch", "undoentries")] * 3
    assert writes == [("patch", "sagas"), *per_step * 3, ("patch-status", "sagas"), *owners, ("patch", "sagas")]
    assert done.status.start_time == Saga.model_validate(created).metadata.creation_timestamp
    assert (done.status.stack_depth, done.status.completion_time is not None) == (3, True)
    assert FINALIZER not in done.metadata.finalizers
    assert [reason for _, reason, _ in operator.kube.events if reason == SagaPhase.ACTIVE] == []


async def test_a_step_that_outlasts_the_moment_shows_its_saga_active_meanwhile(
    operator: Operator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(phases, "ACTIVE_WRITE_AFTER", timedelta(seconds=0.3))
    fresh_orchestrated(operator, "o", ["slow", "work"])

    async def slow(call: PreparedCall) -> None:
        if call.target.url.endswith("/slow"):  # the call is held until the saga shows Active
            phase = await eventually(
                lambda: asyncio.sleep(0, operator.kube.body("sagas", NS, "o").get("status", {}).get("phase")),
                lambda phase: phase == "Active",
                5,
                "Active written while the first step's call is in flight",
            )
            assert phase == "Active"

    operator.transport.on_send = slow
    done = await operator.drive("o")
    assert done.status.phase == "Completed"
    assert operator.transport.paths() == ["/slow", "/work"]
    assert SagaPhase.ACTIVE in [reason for _, reason, _ in operator.kube.events]


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


@pytest.mark.parametrize(
    "args",
    [
        {"copies": ["${steps.create.output}"] * 100},  # one output, a hundred times
        {"text": "${steps.create.output.blob}" * 100},  # spliced into one string
    ],
    ids=["values", "text"],
)
async def test_arguments_that_resolve_past_the_bound_are_refused_and_nothing_is_sent(
    operator: Operator, args: dict[str, Any]
) -> None:
    """A saga of a few KiB whose references multiply a 16 KiB output: 1.6 MB to send here, and
    with 50,000 of them (the API takes that much) gigabytes held by the operator, which its
    memory limit ends, at every restart. Refused like a reference that cannot be resolved."""
    operator.webhook("create")
    operator.webhook("grant")
    blob = "x" * 15_000
    operator.transport.script("/create", CallOutcome(status_code=200, output={"blob": blob}))
    steps = [
        {"name": "create", "action": {"function": "create"}, "compensation": {"function": "undo", "args": {"n": 1}}},
        {"name": "grant", "action": {"function": "grant", "args": args}, "compensation": {"function": "undo"}},
    ]
    operator.saga("o", steps=steps)
    done = await operator.drive("o")
    assert (done.status.phase, done.status.failed_step) == ("Compensated", "grant")
    assert operator.transport.paths() == ["/create", "/undo"]
    never = operator.kube.body("undoentries", NS, "o-2")["status"]
    assert (never["effect"], never["state"]) == ("NotSent", "Skipped")
    assert "resolved, come to more than 1048576 bytes" in never["skipReason"]
    assert ("o", "ArgumentsTooLarge") in [(name, reason) for name, reason, _ in operator.kube.events]


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


async def test_an_effect_that_cannot_be_sent_says_why_within_the_fields_bound(operator: Operator) -> None:
    """Why an effect cannot be sent quotes the reference that failed, which an author can make as
    long as the API takes: past lastError's bound the status could not even be built (pydantic's
    ValidationError), so the saga kept failing in the operator instead of recording the effect."""
    operator.webhook("create")
    operator.webhook("mail")
    operator.transport.script("/create", CallOutcome(status_code=200, output={"id": 1}))
    path = "a" * 5000
    steps = [{"name": "create", "action": {"function": "create"}, "compensation": {"function": "undo"}}]
    effects = [{"name": "thanks", "call": {"function": "mail", "args": {"x": f"${{steps.create.output.{path}}}"}}}]
    operator.saga("o", steps=steps, effects=effects)
    done = await operator.drive("o")
    assert done.status.phase == "Completed"
    (effect,) = done.status.effects
    assert effect.state == "Failed"
    assert effect.last_error is not None
    assert effect.last_error.startswith("UnresolvedReference: ${steps.create.output.aaa")
    assert operator.transport.paths() == ["/create"]
