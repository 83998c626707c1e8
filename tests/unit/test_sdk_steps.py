"""An SDK step's writes on a fake API: created before the call and recorded after it, two
writes for a quick step; one still running IN_FLIGHT_MARK_AFTER later is marked Executing
for people watching, and the outcome is written on the marked copy."""

from __future__ import annotations

import asyncio
from typing import cast

import pytest

from tests.support.fakes import FakeKube
from undolog.api.common import Plural
from undolog.conventions import IN_FLIGHT_MARK_AFTER
from undolog.errors import SagaEnded
from undolog.kube import Body, Kube
from undolog.sdk import open_saga
from undolog.sdk.saga import RESUMED_FRESH_SECONDS, known_saga, resumed_saga

WRITES = {"create", "patch", "patch-status", "replace", "replace-status"}


def entry_writes(kube: FakeKube) -> list[str]:
    return [verb for verb, plural in kube.requests if plural == "undoentries" and verb in WRITES]


def effect(kube: FakeKube, name: str) -> str:
    return str(kube.objects[("undoentries", "a", name)].get("status", {}).get("effect", "Pending"))


async def test_a_quick_step_costs_two_entry_writes_and_is_never_marked() -> None:
    kube = FakeKube()
    run = await open_saga("order", namespace="a", kube=cast(Kube, kube))
    async with run.step("create_user") as step:
        assert effect(kube, step.entry_name) == "Pending"  # registered: compensated as unknown on an abort
        step.output = {"id": 7}
    await asyncio.sleep(IN_FLIGHT_MARK_AFTER + 0.2)  # a mark that was not cancelled would land now
    assert effect(kube, step.entry_name) == "Committed"
    assert len(entry_writes(kube)) == 2, kube.requests


async def test_a_slow_step_is_marked_executing_and_then_recorded_on_the_marked_copy() -> None:
    kube = FakeKube()
    run = await open_saga("order", namespace="a", kube=cast(Kube, kube))
    async with run.step("create_user") as step:
        await asyncio.sleep(IN_FLIGHT_MARK_AFTER + 0.3)
        assert effect(kube, step.entry_name) == "Executing"
        step.output = {"id": 7}
    assert effect(kube, step.entry_name) == "Committed"
    assert kube.objects[("undoentries", "a", step.entry_name)]["status"]["output"] == {"id": 7}
    assert len(entry_writes(kube)) == 3, kube.requests


def saga_reads(kube: FakeKube) -> int:
    return kube.requests.count(("get", "sagas"))


async def test_the_step_registered_as_its_saga_is_resumed_reads_the_saga_once_and_the_next_reads_it_again() -> None:
    """A stateless MCP request resumes its saga by its handle and registers its step at once: the
    saga is read once for both. The next step reads it again, and sees an abort made meanwhile."""
    kube = FakeKube()
    opened = await open_saga("order", namespace="a", kube=cast(Kube, kube))
    kube.requests.clear()
    run = await resumed_saga(cast(Kube, kube), "a", "order", last_position=0)
    await run.register("create_user", None)
    assert saga_reads(kube) == 1, kube.requests
    await opened.abort("a person aborted it")
    with pytest.raises(SagaEnded):
        await run.register("charge_card", None)
    assert saga_reads(kube) == 2, kube.requests


async def test_a_step_registered_long_after_its_saga_was_resumed_reads_the_saga_again() -> None:
    kube = FakeKube()
    opened = await open_saga("order", namespace="a", kube=cast(Kube, kube))
    run = await resumed_saga(cast(Kube, kube), "a", "order", last_position=0)
    await opened.abort("a person aborted it")
    assert run._resumed_at is not None
    run._resumed_at -= RESUMED_FRESH_SECONDS + 1  # resumed that long ago (the event loop's clock untouched)
    with pytest.raises(SagaEnded):
        await run.register("create_user", None)


class ReadAfterCreating(FakeKube):
    """Answers a saga's read only once an entry's creation has begun: a step that read its saga
    before creating its entry waits here until the test's deadline."""

    def __init__(self) -> None:
        super().__init__()
        self.creating = asyncio.Event()

    async def create(self, plural: Plural, namespace: str, body: Body) -> Body:
        if plural == "undoentries":
            self.creating.set()
        return await super().create(plural, namespace, body)

    async def get(self, plural: Plural, namespace: str, name: str) -> Body:
        if plural == "sagas":
            await self.creating.wait()
        return await super().get(plural, namespace, name)


async def test_a_step_s_saga_is_read_while_its_entry_is_created_not_before() -> None:
    kube = ReadAfterCreating()
    run = await open_saga("order", namespace="a", kube=cast(Kube, kube))
    step = await asyncio.wait_for(run.register("create_user", None), timeout=5)
    assert effect(kube, step.entry_name) == "Pending"
    assert saga_reads(kube) == 1, kube.requests


async def test_a_step_of_a_saga_aborted_meanwhile_is_recorded_not_sent_and_not_run() -> None:
    kube = FakeKube()
    opened = await open_saga("order", namespace="a", kube=cast(Kube, kube))
    run = await resumed_saga(cast(Kube, kube), "a", "order", last_position=0)
    run._resumed_at = None  # read long ago: the step reads it again
    await opened.abort("a person aborted it")
    with pytest.raises(SagaEnded, match=r"saga a/order is Active \(outcome Abort\): step 'create_user' was recorded"):
        async with run.step("create_user"):
            raise AssertionError("the step's body ran in an aborted saga")
    [entry] = await kube.list("undoentries", "a")
    assert entry["status"]["effect"] == "NotSent"
    assert "the step's call was not sent" in entry["status"]["lastError"]
    with pytest.raises(SagaEnded, match=r"\(outcome Abort\): step 'charge_card' was not registered or run"):
        await run.register("charge_card", None)
    # refused before any write: an agent that goes on calling adds nothing
    assert len(await kube.list("undoentries", "a")) == 1


async def test_a_step_of_a_saga_known_only_by_name_is_refused_when_it_is_another_saga_now() -> None:
    kube = FakeKube()
    opened = await open_saga("order", namespace="a", kube=cast(Kube, kube))
    run = known_saga(cast(Kube, kube), "a", "order", "the-uid-of-an-older-saga", last_position=0)
    with pytest.raises(SagaEnded, match="is another saga of that name now"):
        await run.register("create_user", None)
    [entry] = await kube.list("undoentries", "a")
    assert entry["status"]["effect"] == "NotSent"
    # Owned by the saga that is gone, not by the one of that name: the garbage collector's to delete.
    assert [o["uid"] for o in entry["metadata"]["ownerReferences"]] == ["the-uid-of-an-older-saga"]
    assert opened.saga.metadata.uid != "the-uid-of-an-older-saga"
