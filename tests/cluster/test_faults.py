"""Faults nobody tuned to (issue "The promise holds under faults"): each test reproduces one
defect found by scenarios written independently of the project's own tests."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.invariants import check
from tests.chaos.workload import as_call
from tests.cluster.test_compensation import abort, external_saga, register
from tests.conftest import Cluster, OwnCluster, own_control_plane
from tests.support.manifests import call, saga, step, undo_entry, webhook
from tests.support.namespaces import fresh_namespace
from tests.support.operator_process import OperatorProcess
from tests.support.owner_policy import owner_policy_off
from tests.support.participants import Participant, Received, Reply
from tests.support.waiting import eventually, saga_phase
from undolog.errors import KubeError
from undolog.kube import Body, Kube

pytestmark = pytest.mark.cluster


async def committed_entry(kube: Kube, namespace: str, saga_body: Body, position: int, **args: Any) -> Body:
    """An entry as the SDK writes it: created, then its effect Committed."""
    name, uid = saga_body["metadata"]["name"], saga_body["metadata"]["uid"]
    body = undo_entry(name, position, owner_uid=uid, compensation=call("undo", n=position, **args))
    body["spec"]["effectId"] = f"{uid}:step{position}:fwd"
    await kube.create("undoentries", namespace, body)
    return await kube.patch_status("undoentries", namespace, f"{name}-{position}", {"status": {"effect": "Committed"}})


async def events_of(kube: Kube, namespace: str, name: str) -> list[Any]:
    return await kube.events_about(namespace, name)


def rss_peak_kib(pid: int) -> int:
    """The process's peak resident set (VmHWM), from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmHWM for {pid}")


# -- 1. completeness after an apiserver outage -----------------------------------------------


@pytest.mark.fault  # an apiserver outage of its own (23 s): make chaos and CI, not make test
@pytest.mark.skipif(bool(os.environ.get("KUBECONFIG")), reason="restarts the local control plane's apiserver")
async def test_entries_registered_right_after_an_apiserver_outage_are_all_compensated_lifo(tmp_path: Path) -> None:
    """Entry 1 seen by the operator; the apiserver down for 10 s; right after it is back, the
    agent registers entry 2 and aborts (and new sagas are created and aborted). Every saga must
    be compensated newest first, and none may be declared Compensated while an entry is owed."""
    async with own_control_plane(tmp_path) as own:
        await compensated_across_the_outage(own, tmp_path)


async def compensated_across_the_outage(own: OwnCluster, tmp_path: Path) -> None:
    kube, namespace, participant, local = own.kube, own.namespace, own.participant, own.local
    operator = OperatorProcess(own.kubeconfig, namespace, tmp_path)
    try:
        operator.start()
        await kube.create("webhooks", namespace, webhook("undo", url=participant.url("/undo")))
        old = [await kube.create("sagas", namespace, saga(f"old-{i}")) for i in range(3)]
        for body in old:
            await committed_entry(kube, namespace, body, 1)
        for body in old:  # the operator has seen entry 1 of each
            await eventually(
                functools.partial(kube.get, "sagas", namespace, body["metadata"]["name"]),
                lambda s: s.get("status", {}).get("stackDepth") == 1,
                30,
                "stackDepth 1",
            )
        await asyncio.to_thread(local.restart, "kube-apiserver", 10.0)
        for body in old:
            await committed_entry(kube, namespace, body, 2)
            await kube.patch("sagas", namespace, body["metadata"]["name"], {"spec": {"outcome": "Abort"}})
        for i in range(3):
            body = await kube.create("sagas", namespace, saga(f"new-{i}"))
            for position in (1, 2):
                await committed_entry(kube, namespace, body, position)
            await kube.patch("sagas", namespace, f"new-{i}", {"spec": {"outcome": "Abort"}})
        names = [f"old-{i}" for i in range(3)] + [f"new-{i}" for i in range(3)]
        final = [await saga_phase(kube, namespace, name, "Compensated", within=120) for name in names]
        entries = await kube.list("undoentries", namespace)
        calls = [as_call(r) for r in participant.received("/undo")]
        report = check(final, entries, [], calls)
        assert report.violations == []
        for body in final:
            assert body["status"]["compensatedCount"] == 2, body["status"]
            reasons = [e.reason for e in await events_of(kube, namespace, body["metadata"]["name"])]
            assert "LateEntry" not in reasons, f"{body['metadata']['name']} was declared Compensated too early"
        # Newest first, for every saga: entry 2's compensation arrived before entry 1's.
        for name in names:
            order = [r.body["n"] for r in participant.received("/undo") if r.headers["undolog-saga"].endswith(name)]
            assert order[:2] == [2, 1], f"{name}: {order}"
    finally:
        operator.stop()


# -- 2. timeoutSeconds bounds a whole attempt ---------------------------------------------------


async def test_a_participant_that_trickles_bytes_is_cut_off_at_the_timeout(
    kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess
) -> None:
    participant.script("/undo", Reply(200, drip=0.5))
    hook = webhook("undo", url=participant.url("/undo"))
    hook["spec"]["timeoutSeconds"] = 2
    await kube.create("webhooks", namespace, hook)
    created = await kube.create("sagas", namespace, saga("drip"))
    await committed_entry(kube, namespace, created, 1)
    await kube.patch("sagas", namespace, "drip", {"spec": {"outcome": "Abort"}})
    # The first attempt is cut at 2 s and retried (the script is used up: the retry succeeds).
    await saga_phase(kube, namespace, "drip", "Compensated", within=20)
    entry = await kube.get("undoentries", namespace, "drip-1")
    first = entry["status"]["attempts"][0]
    assert first["error"] == "timed out after 2 s"
    assert 1900 <= first["durationMilliseconds"] <= 3000, first


# -- 3. answers are read with a cap --------------------------------------------------------------


async def test_a_huge_answer_is_not_read_into_memory(
    kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess
) -> None:
    size = 256 * 1024 * 1024
    participant.script("/create-do", Reply(200, size=size))
    for function in ("create-do", "create-undo"):
        await kube.create("webhooks", namespace, webhook(function, url=participant.url(f"/{function}")))
    assert operator.process is not None
    before = rss_peak_kib(operator.process.pid)
    steps = [
        {
            "name": "create",
            "action": {"function": "create-do", "args": {}},
            "compensation": {"function": "create-undo", "args": {}},
        }
    ]
    await kube.create("sagas", namespace, saga("huge", steps))
    await saga_phase(kube, namespace, "huge", "Completed", within=60)
    grown_mib = (rss_peak_kib(operator.process.pid) - before) / 1024
    print(f"\noperator peak RSS grew by {grown_mib:.1f} MiB for a {size >> 20} MiB answer")
    assert grown_mib < 32
    entry = await kube.get("undoentries", namespace, "huge-1")
    assert entry["status"]["effect"] == "Committed"  # a 200 came back: the effect happened
    omitted = entry["status"]["outputOmitted"]
    assert omitted["reason"] == "AnswerTooLarge"
    assert "was not read" in omitted["message"]


# -- 4. names that cannot run are refused at admission ----------------------------------------


async def test_a_saga_name_too_long_for_its_entries_is_refused_and_200_runs(
    kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess
) -> None:
    for function in ("s-do", "s-undo"):
        await kube.create("webhooks", namespace, webhook(function, url=participant.url(f"/{function}")))
    steps = [{"name": "s", "action": call("s-do"), "compensation": call("s-undo")}]
    with pytest.raises(KubeError) as refused:
        await kube.create("sagas", namespace, saga("x" * 201, steps))
    assert refused.value.status == 422
    assert "metadata.name" in refused.value.message
    assert "200" in refused.value.message
    longest = "y" * 200
    await kube.create("sagas", namespace, saga(longest, steps))
    await saga_phase(kube, namespace, longest, "Completed")
    assert (await kube.get("undoentries", namespace, f"{longest}-1"))["status"]["effect"] == "Committed"


# -- 6. smaller: every outcome is recorded ---------------------------------------------------------


async def test_an_entry_naming_no_saga_is_reported_on_the_entry(
    cluster: Cluster, kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess
) -> None:
    await owner_policy_off(cluster, kube, namespace)  # as a cluster without the policy holds it
    await kube.create("undoentries", namespace, undo_entry("nobody", 1, compensation=call("undo")))
    entry = await eventually(
        lambda: kube.get("undoentries", namespace, "nobody-1"),
        lambda e: e.get("status", {}).get("reason") == "SagaNotFound",
        30,
        "SagaNotFound on the entry",
    )
    assert f"no Saga 'nobody' in namespace {namespace}" in entry["status"]["lastError"]
    events = await eventually(
        lambda: events_of(kube, namespace, "nobody-1"), lambda found: bool(found), 30, "an Event about the entry"
    )
    assert (events[0].type, events[0].reason) == ("Warning", "SagaNotFound")


async def test_entries_a_saga_does_not_own_are_never_its_steps_and_each_says_why(
    cluster: Cluster, kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess
) -> None:
    """Two entries that name saga "real" without being its own: one owned by another saga, one
    written before "real" existed (SagaNotFound, correctly). Owned by uid alone, "real" calls only
    its own steps, and each of the others says why, on itself, in an Event, and on "real", which
    halts (UnownedEntries) rather than read Compensated with their effects left."""
    await owner_policy_off(cluster, kube, namespace)  # as a cluster without the policy holds them
    await kube.create("webhooks", namespace, webhook("undo", url=participant.url("/undo")))
    early = undo_entry("real", 1, compensation=call("undo", who="early"))
    await kube.create("undoentries", namespace, early)
    await eventually(
        lambda: kube.get("undoentries", namespace, "real-1"),
        lambda e: e.get("status", {}).get("reason") == "SagaNotFound",
        30,
        "SagaNotFound on the entry written before its saga",
    )
    other = await kube.create("sagas", namespace, saga("other"))
    real = await kube.create("sagas", namespace, saga("real"))
    await committed_entry(kube, namespace, real, 2, who="mine")
    foreign = undo_entry("real", 3, owner_uid=other["metadata"]["uid"], compensation=call("undo", who="foreign"))
    foreign["metadata"]["ownerReferences"][0]["name"] = "other"  # its owner as the garbage collector finds it
    await kube.create("undoentries", namespace, foreign)
    await abort(kube, namespace, "real")
    done = await saga_phase(kube, namespace, "real", "Halted")

    assert [r.body["who"] for r in participant.received("/undo")] == ["mine"]
    assert (done["status"]["stackDepth"], done["status"]["reason"]) == (1, "UnownedEntries")
    await eventually(  # real-3 came just before the abort: named once the operator saw it
        lambda: kube.get("sagas", namespace, "real"),
        lambda body: body["status"].get("unownedEntries") == ["real-1", "real-3"],
        30,
        "the saga naming both entries it does not own",
    )
    for name, held in (("real-1", "has no ownerReference to it"), ("real-3", "is owned by another Saga")):
        entry = await eventually(
            lambda name=name: kube.get("undoentries", namespace, name),  # type: ignore[misc]
            lambda e: e.get("status", {}).get("reason") == "NotOwnedBySaga",
            30,
            f"NotOwnedBySaga on {name}",
        )
        assert held in entry["status"]["lastError"]
        assert f"ownerReference to uid {real['metadata']['uid']}" in entry["status"]["lastError"]
        assert entry["status"].get("state", "Pending") == "Pending"
        events = await eventually(
            lambda name=name: events_of(kube, namespace, name),  # type: ignore[misc]
            lambda found: any(e.reason == "EntryNotOwned" for e in found),
            30,
            f"an EntryNotOwned Event about {name}",
        )
        assert all(e.type == "Warning" for e in events if e.reason == "EntryNotOwned")
    said = await eventually(  # in one Event or two, as the entries came
        lambda: events_of(kube, namespace, "real"),
        lambda found: all(
            any(e.reason == "EntryNotOwned" and n in e.message for e in found) for n in ("real-1", "real-3")
        ),
        30,
        "EntryNotOwned Events about the saga naming both",
    )
    assert all(e.type == "Warning" for e in said if e.reason == "EntryNotOwned")


async def test_an_entry_registered_after_completion_is_recorded_never_compensated(
    kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess
) -> None:
    await kube.create("webhooks", namespace, webhook("undo", url=participant.url("/undo")))
    created = await kube.create("sagas", namespace, saga("done"))
    await committed_entry(kube, namespace, created, 1)
    await kube.patch("sagas", namespace, "done", {"spec": {"outcome": "Commit"}})
    await saga_phase(kube, namespace, "done", "Completed")
    await committed_entry(kube, namespace, created, 2)
    entry = await eventually(
        lambda: kube.get("undoentries", namespace, "done-2"),
        lambda e: e.get("status", {}).get("state") == "Skipped",
        30,
        "the late entry recorded",
    )
    assert entry["status"]["reason"] == "RegisteredAfterCompletion"
    assert "Completed" in entry["status"]["skipReason"]
    assert participant.received() == []
    # Events are posted from a queue after the write: waited for, not read at once (which saw
    # only ['Active'] in a clean-clone make test).
    await eventually(
        lambda: events_of(kube, namespace, "done"),
        lambda events: "EntryAfterCompletion" in [e.reason for e in events],
        10,
        "the EntryAfterCompletion Event",
    )


async def test_a_forward_answer_that_is_not_json_says_why_the_output_is_missing(
    kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess
) -> None:
    participant.script("/make-do", Reply(200, raw=b"<html>created</html>"))
    await register(kube, namespace, participant, "make-do", "make-undo")
    await kube.create("sagas", namespace, saga("html", [step("make")]))
    await saga_phase(kube, namespace, "html", "Completed")
    entry = await kube.get("undoentries", namespace, "html-1")
    assert "output" not in entry["status"]
    assert entry["status"]["outputOmitted"]["reason"] == "AnswerNotJson"
    assert "not a JSON object" in entry["status"]["outputOmitted"]["message"]


@pytest.mark.parametrize("answer", [b'{"id": "u-1", "amount": 1e999}', b'{"id": "u-1", "amount": NaN}'])
async def test_a_forward_answer_with_a_number_json_cannot_carry_is_not_kept_and_the_saga_goes_on(
    kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess, answer: bytes
) -> None:
    """1e999 is valid JSON that Python reads as inf; NaN is not JSON and Python reads it. Either
    was written back as null (pydantic's JSON for a non-finite float), which the status merge
    patch takes as "delete the key": the stored output lost `amount` without a word."""
    participant.script("/make-do", Reply(200, raw=answer))
    await register(kube, namespace, participant, "make-do", "make-undo", "next-do", "next-undo")
    await kube.create("sagas", namespace, saga("huge-number", [step("make"), step("next")]))
    await saga_phase(kube, namespace, "huge-number", "Completed")
    entry = await kube.get("undoentries", namespace, "huge-number-1")
    assert "output" not in entry["status"]
    assert entry["status"]["outputOmitted"]["reason"] == "AnswerNotJson"
    assert "a number JSON cannot carry" in entry["status"]["outputOmitted"]["message"]
    assert [r.path for r in participant.received()] == ["/make-do", "/next-do"]


async def test_an_integer_the_api_would_round_is_not_kept_and_never_reaches_a_compensation_rounded(
    kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess
) -> None:
    """The API stores an integer beyond 64 bits as a float64: a participant's id
    123456789012345678901234567890 was kept as 1.2345678901234568e+29, and the compensation
    that names it was sent that number, the id of something else or of nothing."""
    participant.script("/make-do", Reply(200, raw=b'{"id": 123456789012345678901234567890}'))
    participant.script("/fail-do", Reply(400))
    await register(kube, namespace, participant, "make-do", "make-undo", "fail-do", "fail-undo")
    make = step("make")
    make["compensation"]["args"] = {"id": "${steps.make.output.id}"}
    await kube.create("sagas", namespace, saga("big-id", [make, step("fail")]))
    await saga_phase(kube, namespace, "big-id", "Compensated")
    entry = await kube.get("undoentries", namespace, "big-id-1")
    assert "output" not in entry["status"]
    assert entry["status"]["outputOmitted"]["reason"] == "AnswerNotJson"
    assert "123456789012345678901234567890, an integer beyond 64 bits" in entry["status"]["outputOmitted"]["message"]
    # Sent as a step never answered: null, with the Undolog-Forward-Key to find the effect by.
    assert participant.received("/make-undo")[0].body == {"id": None}


async def test_a_null_in_a_forward_answer_is_kept_and_the_next_step_gets_it(
    kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess
) -> None:
    """The output was written with a merge patch, which takes a null inside an object as "delete
    the key": `"parent": null` was stored without `parent`, and the next step's reference to
    it failed the saga ("the output of step 'make' has no 'parent'"), which was compensated."""
    participant.script("/make-do", Reply(200, {"id": "u-1", "parent": None}))
    await register(kube, namespace, participant, "make-do", "make-undo", "link-do", "link-undo")
    link = step("link")
    link["action"]["args"] = {"parent": "${steps.make.output.parent}"}
    await kube.create("sagas", namespace, saga("nulls", [step("make"), link]))
    await saga_phase(kube, namespace, "nulls", "Completed")
    assert (await kube.get("undoentries", namespace, "nulls-1"))["status"]["output"] == {"id": "u-1", "parent": None}
    assert participant.received("/link-do")[0].body == {"parent": None}


async def test_an_agent_writing_its_entry_during_compensation_does_not_cause_a_second_call(
    kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess
) -> None:
    loop = asyncio.get_running_loop()

    def undo(request: Received) -> Reply:
        # The agent records its effect's outcome late, while the compensation is in flight.
        patch = {"status": {"effect": "Committed", "executedAt": "2099-01-01T00:00:00.000000Z"}}
        asyncio.run_coroutine_threadsafe(kube.patch_status("undoentries", namespace, "race-1", patch), loop).result()
        return Reply(200, {"undone": True})

    participant.handle("/undo", undo)
    await kube.create("webhooks", namespace, webhook("undo", url=participant.url("/undo")))
    created = await kube.create("sagas", namespace, saga("race"))
    body = undo_entry("race", 1, owner_uid=created["metadata"]["uid"], compensation=call("undo"))
    await kube.create("undoentries", namespace, body)
    await kube.patch("sagas", namespace, "race", {"spec": {"outcome": "Abort"}})
    await saga_phase(kube, namespace, "race", "Compensated")
    assert len(participant.received("/undo")) == 1
    entry = await kube.get("undoentries", namespace, "race-1")
    assert entry["status"]["state"] == "Compensated"
    assert entry["status"]["effect"] == "Committed"  # the agent's write is kept too


async def test_an_agents_oversized_reason_and_step_name_do_not_stop_compensation(
    kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess
) -> None:
    """Text from agents and people lands in bounded fields (status.message 4096 characters,
    failedStep 63): cut to fit, never a write the API refuses forever."""
    await kube.create("webhooks", namespace, webhook("undo", url=participant.url("/undo")))
    created = await kube.create("sagas", namespace, saga("wordy"))
    await committed_entry(kube, namespace, created, 1)
    annotations = {"undolog.io/abort-reason": "x" * 1024, "undolog.io/failed-step": "s" * 200}
    await kube.patch("sagas", namespace, "wordy", {"metadata": {"annotations": annotations}})
    await kube.patch("sagas", namespace, "wordy", {"spec": {"outcome": "Abort"}})
    done = await saga_phase(kube, namespace, "wordy", "Compensated")
    assert len(done["status"]["failedStep"]) == 63
    assert done["status"]["failedStep"].endswith("…")
    assert len(participant.received("/undo")) == 1


# -- 7. objects nested as deep as the API stores -------------------------------------------------


@pytest.mark.parametrize("shards", [1, 2])
async def test_an_entry_nested_as_deep_as_the_api_stores_is_reported_and_its_namespace_goes_on(
    kube: Kube, namespace: str, participant: Participant, cluster: Cluster, tmp_path: Path, shards: int
) -> None:
    """An agent's entry whose args nest 5,000 levels, which the API takes (it stores 10,000).
    Before, Python's json raised RecursionError on every listing that held it. With one shard
    the operator took charge of no saga in the namespace ("could not take charge (maximum
    recursion depth exceeded ...); starting again", forever); with two, kopf's watch of the
    objects without a bucket label failed and the operator process exited. Now that entry is
    filed into its bucket and reported lost on its saga, by field, and the namespace's other
    sagas are compensated as usual."""
    await kube.create("webhooks", namespace, webhook("undo", url=participant.url("/undo")))
    deep = await kube.create("sagas", namespace, saga("deep"))
    fine = await kube.create("sagas", namespace, saga("fine"))
    body = undo_entry("deep", 1, owner_uid=deep["metadata"]["uid"], compensation=call("undo", x="ARGS"))
    cluster.kubectl(
        "create",
        "-n",
        namespace,
        "-f",
        "-",
        stdin=json.dumps(body).replace('"ARGS"', '{"a":' * 5000 + "1" + "}" * 5000),
    )
    await committed_entry(kube, namespace, fine, 1)
    for name in ("deep", "fine"):
        await kube.patch("sagas", namespace, name, {"spec": {"outcome": "Abort"}})
    operator = OperatorProcess(cluster.kubeconfig, namespace, tmp_path, (f"--shards={shards}",))
    operator.start()
    try:
        await saga_phase(kube, namespace, "fine", "Compensated")
        halted = await saga_phase(kube, namespace, "deep", "Halted")
    finally:
        operator.stop()
    assert [r.headers["undolog-saga"] for r in participant.received()] == [f"{namespace}/fine"]
    lost = halted["status"]["lostEntries"]
    assert [entry["name"] for entry in lost] == ["deep-1"]
    assert lost[0]["why"].startswith("unreadable: spec.compensation.args: ")
    assert "nests 5001 levels of objects and arrays; UndoLog reads at most 32" in lost[0]["why"]


async def test_an_operator_watching_many_namespaces_still_drives_their_sagas(
    kube: Kube, namespace: str, participant: Participant, cluster: Cluster, tmp_path: Path
) -> None:
    """Each watched namespace holds three watches open (sagas, entries, Webhooks), and they went
    over the requests' pool of 100 connections: from 34 namespaces on (`watchNamespaces` as a
    platform team lists them) they held every connection, and the operator led and did nothing,
    its requests waiting for good."""
    async with contextlib.AsyncExitStack() as made:
        others = [await made.enter_async_context(fresh_namespace(kube, f"{namespace}-{i}")) for i in range(40)]
        await register(kube, others[-1], participant, "undo")
        operator = OperatorProcess(
            cluster.kubeconfig, namespace, tmp_path, extra_args=tuple(f"--namespace={name}" for name in others)
        )
        operator.start()
        try:
            await external_saga(kube, others[-1], "far", [call("undo", n=1), call("undo", n=2)])
            await abort(kube, others[-1], "far")
            await saga_phase(kube, others[-1], "far", "Compensated", within=30)
        finally:
            operator.stop()
    assert [r.body["n"] for r in participant.received("/undo")] == [2, 1]


async def test_a_namespace_is_not_kept_behind_another_namespaces_sagas_on_a_hanging_participant(
    kube: Kube, namespace: str, participant: Participant, cluster: Cluster, tmp_path: Path
) -> None:
    """A tenant's sagas aborted together against a participant that hangs fill the operator's
    slots (here 2, by --max-concurrent-sagas) until each call times out. In one queue, first
    come first served, another namespace's saga aborted after them was compensated only after
    all of them had timed out; the namespaces now take turns for the next free slot."""
    async with fresh_namespace(kube, f"{namespace}-quiet") as quiet:
        participant.handle("/hang", lambda request: Reply(200, delay=5))
        hang = webhook("hang", url=participant.url("/hang"))
        hang["spec"]["timeoutSeconds"] = 1
        # A timeout is an outage: a budget of one timeout, so that each saga halts after one call as
        # before (otherwise they wait, their slots free, which is what this test is about too).
        hang["spec"]["outageBudgetSeconds"] = 1
        await kube.create("webhooks", namespace, hang)
        await register(kube, quiet, participant, "undo")
        once: dict[str, Any] = {"compensationPolicy": {"backoff": {"maxRetries": 0}}}
        busy = [f"busy-{i}" for i in range(8)]
        for name in busy:
            await external_saga(kube, namespace, name, [call("hang", saga=name)], **once)
        await external_saga(kube, quiet, "quiet", [call("undo", saga="quiet")])
        operator = OperatorProcess(
            cluster.kubeconfig, namespace, tmp_path, extra_args=(f"--namespace={quiet}", "--max-concurrent-sagas=2")
        )
        operator.start()
        try:
            for name in busy:
                await abort(kube, namespace, name)
            await participant.until(lambda received: len(received) >= 2, within=30)  # both slots taken
            await abort(kube, quiet, "quiet")
            await saga_phase(kube, quiet, "quiet", "Compensated", within=30)
            for name in busy:
                await saga_phase(kube, namespace, name, "Halted", within=30)
        finally:
            operator.stop()
    paths = [r.path for r in participant.received()]
    print(f"\nthe other namespace's call: {paths.index('/undo') + 1} of {len(paths)}")
    # At most one call each: once 5 in a row timed out, the breaker held the rest (their budget spent waiting).
    assert paths.count("/hang") <= len(busy)
    # The two calls in flight when it was aborted, and at most the two that took their slots as
    # they timed out together: in one queue it came after all eight.
    assert paths.index("/undo") <= 4, paths


class StillProcessing:
    """A participant that keeps the Idempotency-Key draft (draft-ietf-httpapi-idempotency-key-
    header): a request retried while the first one under its key is still being processed is
    answered 409 Conflict, to be retried as is; once done, with the first one's result."""

    def __init__(self, takes: float) -> None:
        self.takes = takes
        self.began: dict[str, float] = {}
        self.lock = threading.Lock()

    def __call__(self, request: Received) -> Reply:
        with self.lock:
            first = request.key not in self.began
            began = self.began.setdefault(request.key, time.monotonic())
        if first:
            return Reply(200, {"refunded": True}, delay=self.takes)
        if time.monotonic() - began < self.takes:
            return Reply(409, {"title": "A request is outstanding for this Idempotency-Key"})
        return Reply(200, {"refunded": True})


async def test_a_participant_still_processing_a_timed_out_attempt_is_asked_again_not_given_up_on(
    kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess
) -> None:
    """The first attempt outlasts its 1 s timeout; the participant, still processing it, answers
    the retries 409 as the Idempotency-Key draft says (retry as is). 409 was permanent: the saga
    halted CompensationFailed while the refund was under way."""
    participant.handle("/undo", StillProcessing(takes=3.0))
    hook = webhook("undo", url=participant.url("/undo"))
    hook["spec"]["timeoutSeconds"] = 1
    await kube.create("webhooks", namespace, hook)
    patient = {"backoff": {"initialMilliseconds": 200, "maxMilliseconds": 1000, "maxRetries": 10}}
    await external_saga(kube, namespace, "refund", [call("undo", n=1)], compensationPolicy=patient)
    await abort(kube, namespace, "refund")
    await saga_phase(kube, namespace, "refund", "Compensated", within=30)
    replies = [r.replied for r in participant.received("/undo")]
    assert 409 in replies, replies
    assert replies[-1] == 200, replies
    assert len({r.key for r in participant.received("/undo")}) == 1


async def test_an_operator_whose_clock_runs_ahead_keeps_to_the_deadline_by_the_apis_clock(
    kube: Kube, namespace: str, participant: Participant, cluster: Cluster, tmp_path: Path
) -> None:
    """A saga's deadline runs from the apiserver's creationTimestamp. An operator on a node
    whose clock runs 20 minutes ahead (libfaketime) judged it by its own clock: the agent's saga,
    given 8 s, was past its deadline when created and undone at once while the agent worked."""
    await register(kube, namespace, participant, "undo")
    operator = OperatorProcess(cluster.kubeconfig, namespace, tmp_path, clock_off_by="+20m")
    operator.start()
    try:
        created = time.monotonic()
        await external_saga(kube, namespace, "timed", [call("undo", n=1)], activeDeadlineSeconds=8)
        compensated = await saga_phase(kube, namespace, "timed", "Compensated", within=30)
    finally:
        operator.stop()
    succeeded = next(c for c in compensated["status"]["conditions"] if c["type"] == "Succeeded")
    assert succeeded["reason"] == "DeadlineExceeded"
    (undone,) = participant.received("/undo")
    waited = undone.at - created
    print(f"\nundone {waited:.1f} s after the saga was created, its deadline 8 s")
    assert waited >= 7.0
