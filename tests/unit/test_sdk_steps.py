"""An SDK step's writes on a fake API: created before the call and recorded after it, two
writes for a quick step; one still running IN_FLIGHT_MARK_AFTER later is marked Executing
for people watching, and the outcome is written on the marked copy."""

from __future__ import annotations

import asyncio
from typing import cast

from tests.support.fakes import FakeKube
from undolog.conventions import IN_FLIGHT_MARK_AFTER
from undolog.kube import Kube
from undolog.sdk import open_saga

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
