"""Fault injection with invariant checks, marked `fault`: `make chaos` (and CI) runs them at full
size (UNDOLOG_CHAOS=full) and records the counts in bench/results/chaos.json (summarised in
docs/reliability.md); `pytest tests/chaos` runs a short version of each; `make test` none.

1. kill -9 of the operator at random moments, restarted each time, while sagas run forward
   and are compensated.
2. kube-apiserver restart, and etcd restart, in the middle of a run; also with two replicas
   sharing four shards.
3. A kube-apiserver outage of 10 s while agents keep registering entries and aborting, before,
   during (retrying) and right after it.
4. Participants that time out, reset connections, answer 503 in bursts, 429 with Retry-After,
   garbage bodies, very slow responses, bytes trickled forever, and huge answers.
5. Bad input: generated Saga and UndoEntry manifests are refused with a message or accepted
   and handled; the operator never crashes or stalls.
6. The archive through PostgreSQL killed (SIGKILL) and restarted, the operator killed, and a
   writer labelling the sagas (409s on the operator's writes): every row whole, no saga
   deleted without one.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import random
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from devtools.control_plane.local import free_port
from devtools.postgres import PASSWORD, LocalPostgres
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.chaos.faults import Faults
from tests.chaos.invariants import archive_violations, check
from tests.chaos.workload import POLICY, Workload, as_call, participant_calls
from tests.cluster.test_archive import label_patches, rows
from tests.conftest import REPO, Cluster, OwnCluster, own_control_plane
from tests.support.manifests import call, saga, undo_entry, webhook
from tests.support.operator_process import OperatorProcess
from tests.support.owner_policy import owner_policy_off
from tests.support.participants import HttpsParticipant, Participant, Reply
from tests.support.waiting import eventually
from undolog.errors import AlreadyExists, KubeError
from undolog.kube import Body, Kube

pytestmark = [pytest.mark.cluster, pytest.mark.fault]
FULL = os.environ.get("UNDOLOG_CHAOS") == "full"
RESULTS = REPO / "bench" / "results" / "chaos.json"


def record(scenario: str, counts: dict[str, Any]) -> None:
    print(f"\n{scenario}: {json.dumps(counts)}")
    if FULL:
        results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
        results[scenario] = counts
        RESULTS.parent.mkdir(exist_ok=True)
        RESULTS.write_text(json.dumps(results, indent=2))


async def test_kill_9_at_random_moments(kube: Kube, namespace: str, cluster: Cluster, tmp_path: Path) -> None:
    sagas = 200 if FULL else 12
    rng = random.Random(7)
    participant = Participant()
    faults = Faults(seed=7, rate=0.0)  # only the operator misbehaves here
    participant.handle("/do", faults.handler)
    participant.handle("/undo", faults.handler)
    operator = OperatorProcess(cluster.kubeconfig, namespace, tmp_path, extra_args=())
    operator.start()
    workload = Workload(kube, namespace, participant, sagas)
    kills = 0
    try:
        starting = asyncio.create_task(workload.start())
        deadline = time.monotonic() + (600 if FULL else 120)
        # The small run is done in a few seconds: kill more often, so it is killed mid-work more than once.
        low, high = (0.3, 2.0) if FULL else (0.1, 0.6)
        while time.monotonic() < deadline:
            await asyncio.sleep(rng.uniform(low, high))
            operator.kill()
            kills += 1
            operator.start()
            if starting.done() and await _all_final(kube, namespace, sagas):
                break
        await starting
        final = await workload.settled(within=300 if FULL else 120)
        report = await workload.report(final)
    finally:
        operator.stop()
        participant.close()
    record("kill9", {**report.as_dict(), "faults_injected": kills, "fault": "kill -9 of the operator"})
    assert report.violations == []
    assert kills >= 2


async def _all_final(kube: Kube, namespace: str, count: int) -> bool:
    sagas = await kube.list("sagas", namespace)
    return len(sagas) == count and all(
        s.get("status", {}).get("phase") in ("Completed", "Compensated", "Halted") for s in sagas
    )


@pytest.mark.skipif(bool(os.environ.get("KUBECONFIG")), reason="restarts the local control plane's processes")
async def test_apiserver_and_etcd_restart_mid_run(tmp_path: Path) -> None:
    """A control plane of its own, so the restarts disturb no other test."""
    async with own_control_plane(tmp_path) as own:
        await through_restarts(own, tmp_path)


async def test_replicas_sharing_shards_ride_out_apiserver_and_etcd_restarts(tmp_path: Path) -> None:
    """The same with two replicas sharing four shards: each shard's Lease, the replicas'
    membership and every saga's proof go through the restarts."""
    async with own_control_plane(tmp_path) as own:
        await through_restarts(own, tmp_path, replicas=2)


async def through_restarts(own: OwnCluster, tmp_path: Path, replicas: int = 1) -> None:
    sagas = 60 if FULL else 9 * replicas
    kube, namespace, participant, local = own.kube, own.namespace, own.participant, own.local
    faults = Faults(seed=11, rate=0.0)
    participant.handle("/do", lambda r: faults.handler(r))
    participant.handle("/undo", lambda r: faults.handler(r))
    sharing = ("--shards=4",) if replicas > 1 else ()
    operators = [
        OperatorProcess(own.kubeconfig, namespace, tmp_path / f"replica-{i}", extra_args=sharing)
        for i in range(replicas)
    ]
    for operator in operators:
        operator.start()
    workload = Workload(kube, namespace, participant, sagas)
    downtime: dict[str, float] = {}
    unfinished: dict[str, int] = {}
    try:
        await workload.start()
        # The apiserver restarts once calls are arriving; etcd once the operator made calls
        # again after that (unless the apiserver's graceful shutdown let every saga finish:
        # how many were unfinished at each restart is recorded).
        await participant.until(lambda received: len(received) >= 1, within=60)
        unfinished["kube-apiserver"] = len(await workload.unfinished())
        downtime["kube-apiserver"] = await asyncio.to_thread(local.restart, "kube-apiserver")
        before = len(participant.received())
        stuck = await eventually(
            workload.unfinished,
            lambda stuck: not stuck or len(participant.received()) > before,
            within=60,
            what="calls after the apiserver restart",
        )
        unfinished["etcd"] = len(stuck)
        downtime["etcd"] = await asyncio.to_thread(local.restart, "etcd")
        final = await workload.settled(within=300 if FULL else 120)
        report = await workload.report(final)
        for operator in operators:
            assert operator.process is not None
            assert operator.process.poll() is None  # it rode out both restarts
    finally:
        for operator in operators:
            operator.stop()
    record(
        "restarts" if replicas == 1 else f"restarts, {replicas} replicas sharing 4 shards",
        {
            **report.as_dict(),
            "faults_injected": 2,
            "fault": "kube-apiserver restart, then etcd restart",
            "seconds_until_ready": {k: round(v, 1) for k, v in downtime.items()},
            "unfinished_sagas_at_restart": unfinished,
        },
    )
    assert report.violations == []


async def persist(write: Callable[[], Awaitable[Any]], within: float = 120) -> Any:
    """An agent that keeps trying through an outage: the write again until the API takes it
    (a create that went through unseen is found as AlreadyExists)."""
    deadline = time.monotonic() + within
    while True:
        try:
            return await write()
        except AlreadyExists:
            return None
        except KubeError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


@pytest.mark.skipif(bool(os.environ.get("KUBECONFIG")), reason="stops the local control plane's apiserver")
async def test_apiserver_outage_while_agents_register_and_abort(tmp_path: Path) -> None:
    """Agents start before, during and right after a 10 s apiserver outage; each registers
    three entries (a pause before each) and aborts. Every saga must be compensated completely,
    newest first: completeness is proven by a listing, never by the watches' progress."""
    async with own_control_plane(tmp_path) as own:
        await agents_through_an_outage(own, tmp_path)


async def agents_through_an_outage(own: OwnCluster, tmp_path: Path) -> None:
    sagas = 60 if FULL else 12
    rng = random.Random(5)
    kube, namespace, local = own.kube, own.namespace, own.local
    operator = OperatorProcess(own.kubeconfig, namespace, tmp_path, extra_args=())
    workload = Workload(kube, namespace, own.participant, sagas)

    async def agent(i: int, start: float) -> None:
        await asyncio.sleep(start)
        name = f"a{i:03d}"
        created = await persist(lambda: kube.create("sagas", namespace, saga(name, compensationPolicy=POLICY)))
        uid = (created or await persist(lambda: kube.get("sagas", namespace, name)))["metadata"]["uid"]
        for position in (1, 2, 3):
            await asyncio.sleep(rng.uniform(0, 1.5))
            body = undo_entry(name, position, owner_uid=uid, compensation=call("undo", n=position))
            body["spec"]["effectId"] = f"{uid}:step{position}:fwd"
            await persist(functools.partial(kube.create, "undoentries", namespace, body))
            committed = {"status": {"effect": "Committed"}}
            entry = f"{name}-{position}"
            await persist(functools.partial(kube.patch_status, "undoentries", namespace, entry, committed))
        await persist(lambda: kube.patch("sagas", namespace, name, {"spec": {"outcome": "Abort"}}))

    try:
        operator.start()
        await workload.register()
        # A third start before the outage (at 0-3 s), a third during it (3-13 s), a third after.
        starts = sorted(
            rng.uniform(0, 3) if i % 3 == 0 else rng.uniform(3, 13) if i % 3 == 1 else rng.uniform(13, 18)
            for i in range(sagas)
        )
        agents = asyncio.gather(*(agent(i, start) for i, start in enumerate(starts)))
        await asyncio.sleep(3)  # the outage begins while the first agents are mid-saga
        downtime = await asyncio.to_thread(local.restart, "kube-apiserver", 10.0)
        await agents
        final = await workload.settled(within=300 if FULL else 120)
        report = await workload.report(final)
        entries = await kube.list("undoentries", namespace)
        peak = operator.peak_rss_mib()
        assert operator.process is not None
        assert operator.process.poll() is None  # it rode out the outage
    finally:
        operator.stop()
    incomplete = [s["metadata"]["name"] for s in final if s["status"].get("compensatedCount") != 3]
    record(
        "outage",
        {
            **report.as_dict(),
            "entries": len(entries),
            "faults_injected": 1,
            "fault": "kube-apiserver down 10 s while agents register entries and abort",
            "seconds_until_ready": round(downtime, 1),
            "sagas_compensated_incompletely": len(incomplete),
            "operator_peak_rss_mib": round(peak, 1),
        },
    )
    assert report.violations == []
    assert incomplete == []
    assert all(s["status"]["phase"] == "Compensated" for s in final)


async def test_participants_that_misbehave(kube: Kube, namespace: str, cluster: Cluster, tmp_path: Path) -> None:
    sagas = 200 if FULL else 15
    participant = Participant()
    faults = Faults(seed=3, rate=0.3)
    participant.handle("/do", faults.handler)
    participant.handle("/undo", faults.handler)
    operator = OperatorProcess(cluster.kubeconfig, namespace, tmp_path, extra_args=())
    operator.start()
    workload = Workload(kube, namespace, participant, sagas)
    try:
        await workload.start()
        final = await workload.settled(within=600 if FULL else 150)
        report = await workload.report(final)
        peak = operator.peak_rss_mib()
    finally:
        operator.stop()
        participant.close()
    counts = {
        **report.as_dict(),
        "faults_injected": sum(faults.injected.values()),
        "by_fault": dict(faults.injected),
        "operator_peak_rss_mib": round(peak, 1),
    }
    record("participants", counts)
    assert report.violations == []
    assert faults.injected  # faults did happen
    assert peak < 400  # huge answers are never read whole (the chart's limit is 512 MiB)


# -- entries that are not a saga's own, and certificates that come and go ------------------------


async def rotate(secure: HttpsParticipant, until: asyncio.Event, seed: int) -> int:
    """The participant's certificate swapped for an expired one and back, again and again."""
    from devtools.control_plane.pki import serving_certificate

    valid = serving_certificate(secure.ca, "participant")
    expired = serving_certificate(secure.ca, "participant", not_after=datetime.now(UTC) - timedelta(days=1))
    pick, swaps = random.Random(seed), 0
    while not until.is_set():
        secure.serve(expired)
        await asyncio.sleep(pick.uniform(0.1, 0.5))
        secure.serve(valid)
        swaps += 1
        await asyncio.sleep(pick.uniform(0.3, 1.0))
    return swaps


async def intruded_saga(kube: Kube, namespace: str, name: str, decoy: Body) -> int:
    """An agent's saga of three entries, with two intruders the API refuses (a second entry at a
    taken position, under a name that is not canonical) and one entry that names it but is
    owned by another saga (admitted: the namespace is out of the admission policy), then
    aborted. Returns how many writes the API refused."""
    created = await kube.create("sagas", namespace, saga(name, compensationPolicy=PATIENT))
    uid = created["metadata"]["uid"]
    for position in (1, 2, 3):
        body = undo_entry(name, position, owner_uid=uid, compensation=call("undo", n=position))
        body["spec"]["effectId"] = f"{uid}:step{position}:fwd"
        await kube.create("undoentries", namespace, body)
        await kube.patch_status("undoentries", namespace, f"{name}-{position}", {"status": {"effect": "Committed"}})
    refused = 0
    for intruder in ({"name": f"{name}-02"}, {"name": f"{name}-2"}):
        body = undo_entry(name, 2, owner_uid=uid, compensation=call("undo", n="intruder"))
        body["metadata"].update(intruder)
        try:
            await kube.create("undoentries", namespace, body)
        except (AlreadyExists, KubeError):
            refused += 1
    foreign = undo_entry(name, 4, owner_uid=decoy["metadata"]["uid"], compensation=call("undo", n="foreign"))
    foreign["metadata"]["ownerReferences"][0]["name"] = decoy["metadata"]["name"]
    await kube.create("undoentries", namespace, foreign)
    await kube.patch("sagas", namespace, name, {"spec": {"outcome": "Abort"}})
    return refused


NOT_OWNED = "NotOwnedBySaga"
PATIENT = {"backoff": {"initialMilliseconds": 100, "multiplier": 2, "maxMilliseconds": 1000, "maxRetries": 15}}


async def test_intruders_entries_of_other_sagas_and_certificates_rotated(
    kube: Kube, namespace: str, cluster: Cluster, tmp_path: Path
) -> None:
    sagas = 100 if FULL else 10
    await owner_policy_off(cluster, kube, namespace)  # the operator's own defence, behind the policy's
    secure = HttpsParticipant(tmp_path)
    secure.handle("/undo", lambda _: Reply(headers={"Connection": "close"}))  # every call a new handshake
    hook = webhook("undo", url=secure.url("/undo"), caBundle=secure.bundle, timeoutSeconds=5)
    await kube.create("webhooks", namespace, hook)
    decoy = await kube.create("sagas", namespace, saga("decoy"))
    operator = OperatorProcess(cluster.kubeconfig, namespace, tmp_path, extra_args=())
    operator.start()
    done = asyncio.Event()
    rotating = asyncio.ensure_future(rotate(secure, done, seed=5))
    try:
        names = [f"x{i:04d}" for i in range(sagas)]
        refused = sum(await asyncio.gather(*(intruded_saga(kube, namespace, n, decoy) for n in names)))
        await kube.patch("sagas", namespace, "decoy", {"spec": {"outcome": "Abort"}})
        finals = ("Completed", "Compensated", "Halted")

        async def unfinished() -> list[str]:
            listed = await kube.list("sagas", namespace)
            return [s["metadata"]["name"] for s in listed if s.get("status", {}).get("phase") not in finals]

        await eventually(unfinished, lambda stuck: not stuck, 600 if FULL else 150, f"all {sagas} sagas final")
        done.set()
        swaps = await rotating
        listed = await kube.list("sagas", namespace)
        entries = await kube.list("undoentries", namespace)
        report = check(listed, entries, [], [as_call(r) for r in secure.received("/undo")])
    finally:
        done.set()
        rotating.cancel()
        operator.stop()
        secure.close()
    attempts = [a for e in entries for a in e.get("status", {}).get("attempts", [])]
    rejected = sum(1 for a in attempts if "certificate" in a.get("error", ""))
    counts = {
        **report.as_dict(),
        "intruders_refused": refused,
        "entries_of_other_sagas_reported": sum(
            1 for e in entries if e.get("status", {}).get("reason") == "NotOwnedBySaga"
        ),
        "certificate_swaps": swaps,
        "attempts_on_a_rejected_certificate": rejected,
        "halted": sum(1 for s in listed if s["status"]["phase"] == "Halted"),
    }
    record("intruders", counts)
    assert report.violations == []
    assert refused == 2 * sagas
    assert counts["entries_of_other_sagas_reported"] == sagas
    # Each saga's own three steps undone, then halted for the foreign entry a person must remove.
    own = [s for s in listed if s["metadata"]["name"] != "decoy"]
    assert all(
        (s["status"]["phase"], s["status"].get("reason"), s["status"].get("compensatedCount"))
        == ("Halted", "UnownedEntries", 3)
        for s in own
    ), [s["status"] for s in own if s["status"]["phase"] != "Halted"][:3]


# -- bad input ---------------------------------------------------------------------------------

names = st.from_regex(r"[a-z][a-z0-9_-]{0,20}[a-z0-9]", fullmatch=True)
texts = st.text(max_size=40)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=8,
)
calls = st.fixed_dictionaries(
    {"function": st.one_of(names, texts)},
    optional={
        "version": st.one_of(names, texts),
        "args": st.dictionaries(texts, json_values, max_size=40),
        "maxRetries": st.integers(-5, 200),
        "timeoutSeconds": st.integers(-5, 500),
    },
)
steps = st.fixed_dictionaries(
    {"name": st.one_of(names, texts), "action": calls},
    optional={"type": st.sampled_from(["Compensatable", "Pivot", "Retriable", "Other", ""]), "compensation": calls},
)
saga_specs = st.fixed_dictionaries(
    {},
    optional={
        "steps": st.lists(steps, max_size=5),
        "orgId": st.one_of(names, texts),
        "activeDeadlineSeconds": st.integers(-10, 10),
        "outcome": st.sampled_from(["Commit", "Abort", "Maybe"]),
        "compensationPolicy": st.fixed_dictionaries(
            {},
            optional={
                "onFailure": st.sampled_from(["Halt", "Continue", "Panic"]),
                "backoff": st.dictionaries(
                    st.sampled_from(["initialMilliseconds", "multiplier", "maxMilliseconds", "maxRetries"]),
                    st.one_of(
                        st.integers(-10, 10**7), st.floats(allow_nan=False, allow_infinity=False, width=32), texts
                    ),
                ),
            },
        ),
        "effects": st.lists(st.fixed_dictionaries({"name": st.one_of(names, texts), "call": calls}), max_size=3),
    },
)
entry_specs = st.fixed_dictionaries(
    {
        "saga": names,
        "undoId": st.one_of(st.uuids().map(str), texts),
        "stackPosition": st.integers(-3, 10),
        "effectId": texts,
        "step": st.one_of(names, texts),
        "registeredAt": st.one_of(st.datetimes().map(lambda d: d.isoformat() + "Z"), texts),
    },
    optional={"compensation": calls},
)


def test_generated_manifests_are_refused_or_handled(
    kube: Kube, namespace: str, cluster: Cluster, tmp_path: Path, session_loop: asyncio.AbstractEventLoop
) -> None:
    loop = session_loop
    operator = OperatorProcess(cluster.kubeconfig, namespace, tmp_path, extra_args=())
    operator.start()
    outcome = {"accepted": 0, "refused": 0, "refused_without_field": 0}
    accepted_sagas: list[str] = []

    @settings(
        max_examples=150 if FULL else 25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True
    )
    @given(saga_spec=saga_specs, entry_spec=entry_specs)
    def submit(saga_spec: dict[str, Any], entry_spec: dict[str, Any]) -> None:
        name = f"g{uuid.uuid4().hex[:10]}"
        for plural, body in (
            (
                "sagas",
                {"apiVersion": "undolog.io/v1beta1", "kind": "Saga", "metadata": {"name": name}, "spec": saga_spec},
            ),
            (
                "undoentries",
                {
                    "apiVersion": "undolog.io/v1beta1",
                    "kind": "UndoEntry",
                    "metadata": {"name": f"{entry_spec['saga']}-{entry_spec['stackPosition']}"[:200]},
                    "spec": entry_spec,
                },
            ),
        ):
            try:
                loop.run_until_complete(kube.create(plural, namespace, body))  # type: ignore[arg-type]
                status, message = 201, ""
            except KubeError as error:
                status, message = error.status or 0, error.message
            assert status in (201, 409, 422), message  # accepted, an entry name reused, or refused as invalid
            if status == 422:
                outcome["refused"] += 1
                if "spec." not in message and "metadata.name" not in message:
                    outcome["refused_without_field"] += 1
            if status != 201:
                continue
            outcome["accepted"] += 1
            if plural == "sagas":
                accepted_sagas.append(name)

    try:
        submit()
        assert operator.process is not None
        # Never crashed, never stalled: every accepted saga got a phase.
        deadline = time.monotonic() + 60
        while True:
            sagas = {s["metadata"]["name"]: s for s in loop.run_until_complete(kube.list("sagas", namespace))}
            unphased = [n for n in accepted_sagas if n in sagas and not sagas[n].get("status", {}).get("phase")]
            if not unphased or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert operator.process.poll() is None, operator.log()
        assert unphased == [], f"the operator never took charge of {unphased[:5]}"
    finally:
        operator.stop()
    record("bad_input", {**outcome, "sagas_accepted": len(accepted_sagas), "operator_crashes": 0, "stalled_sagas": 0})
    assert outcome["refused_without_field"] == 0


async def test_the_archive_through_postgres_and_operator_kills_and_write_conflicts(
    kube: Kube, namespace: str, cluster: Cluster, tmp_path: Path, postgres: LocalPostgres
) -> None:
    sagas = 150 if FULL else 24
    rng = random.Random(13)
    participant = Participant()
    faults = Faults(seed=13, rate=0.0)  # PostgreSQL and the operator misbehave here
    participant.handle("/do", faults.handler)
    participant.handle("/undo", faults.handler)
    ttl = ("--ttl-after-completed=2s", "--ttl-after-compensated=2s")
    operator = OperatorProcess(cluster.kubeconfig, namespace, tmp_path, (f"--archive-dsn={postgres.dsn}", *ttl))
    operator.start()
    workload = Workload(kube, namespace, participant, sagas)
    seen = Seen()
    stop = asyncio.Event()
    kills = {"postgres": 0, "operator": 0}
    names = [f"w{i:04d}" for i in range(sagas)]
    watching = asyncio.create_task(seen.watch(kube, namespace, stop))
    writer = asyncio.create_task(label_patches(kube, namespace, names, stop))
    try:
        starting = asyncio.create_task(workload.start())

        async def unsettled() -> list[str]:
            """Once every saga is created: those not final (one gone was final: only retention,
            which deletes finished sagas, takes them away)."""
            phases = {
                s["metadata"]["name"]: s.get("status", {}).get("phase") for s in await kube.list("sagas", namespace)
            }
            return [n for n in names if n in phases and phases[n] not in ("Completed", "Compensated", "Halted")]

        deadline = time.monotonic() + (300 if FULL else 90)
        while time.monotonic() < deadline:
            if min(kills.values()) >= 1 and starting.done() and not await unsettled():
                break
            if kills["postgres"] <= kills["operator"]:  # in turn; how long each is away, at random
                postgres.kill()
                kills["postgres"] += 1
                await asyncio.sleep(rng.uniform(1, 6))
                await asyncio.to_thread(postgres.start)  # in a thread: `seen` lists on meanwhile
            else:
                operator.kill()
                kills["operator"] += 1
                await asyncio.to_thread(operator.start)  # it leads before its /healthz answers
            await asyncio.sleep(rng.uniform(0.5, 2))
        await starting
        await eventually(unsettled, lambda stuck: not stuck, 300 if FULL else 120, f"all {sagas} sagas final")
        final = await kube.list("sagas", namespace)
        stop.set()  # the writer too: a saga changed since it was archived is archived again first
        await writer
        await seen.list(kube, namespace)
        # Over every saga as last seen: most were archived and deleted as soon as they finished.
        report = check(list(seen.sagas.values()), list(seen.entries.values()), *participant_calls(participant))
        finished = {s["metadata"]["name"] for s in final if s["status"]["phase"] in ("Completed", "Compensated")}

        async def left() -> set[str]:
            return finished & {s["metadata"]["name"] for s in await kube.list("sagas", namespace)}

        await eventually(left, lambda names: not names, 120, "every finished saga archived and deleted")
    finally:
        stop.set()
        await asyncio.gather(watching, writer)
        operator.stop()
        participant.close()
    in_etcd = await kube.list("sagas", namespace)
    remaining = {s["metadata"]["uid"] for s in in_etcd}
    archived = await asyncio.to_thread(
        rows,
        postgres,
        "SELECT json_build_object('uid', uid, 'name', name, 'phase', phase, 'entries', entries) FROM undolog_sagas",
    )
    violations = archive_violations([r[0] for r in archived], seen.entry_names(), remaining)  # type: ignore[misc]
    # Every saga is in etcd or archived finished: none went unfinished (which `unsettled` takes on trust).
    gone = set(names) - {s["metadata"]["name"] for s in in_etcd}
    finished_rows = {r[0]["name"] for r in archived if r[0]["phase"] in ("Completed", "Compensated")}  # type: ignore[index]
    violations += [f"{n} left etcd without a finished archive row" for n in sorted(gone - finished_rows)]
    record(
        "archive",
        {
            **report.as_dict(),
            "archived_rows": len(archived),
            "archive_violations": len(violations),
            "faults_injected": sum(kills.values()),
            "postgres_kills": kills["postgres"],
            "operator_kills": kills["operator"],
            "fault": "PostgreSQL and the operator killed (SIGKILL), sagas labelled by a concurrent writer",
        },
    )
    assert violations == []
    assert report.violations == []
    assert kills["postgres"] >= 1
    assert kills["operator"] >= 1


@dataclass
class Seen:
    """The last copy of every saga and entry seen in etcd, by uid, listed every 0.3 s: faster
    than the 2 s a finished saga is kept, so none is deleted unseen (nor its last state)."""

    sagas: dict[str, Body] = field(default_factory=dict)
    entries: dict[str, Body] = field(default_factory=dict)

    async def watch(self, kube: Kube, namespace: str, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.list(kube, namespace)
            await asyncio.sleep(0.3)

    async def list(self, kube: Kube, namespace: str) -> None:
        self.entries.update({e["metadata"]["uid"]: e for e in await kube.list("undoentries", namespace)})
        self.sagas.update({s["metadata"]["uid"]: s for s in await kube.list("sagas", namespace)})

    def entry_names(self) -> dict[str, set[str]]:
        """Entry names by their saga's uid (their owner)."""
        names: dict[str, set[str]] = {}
        for entry in self.entries.values():
            for owner in entry["metadata"].get("ownerReferences", []):
                names.setdefault(owner["uid"], set()).add(entry["metadata"]["name"])
        return names


class HoldingProxy:
    """In front of the participant: holds each forward call until the compensation naming its
    key has gone through (a proxy that held the request past the operator's timeout), then
    delivers it, late."""

    def __init__(self, participant: str) -> None:
        self.participant = participant
        self.compensated: dict[str, asyncio.Event] = {}
        self.late: list[int] = []  # the statuses the late forward calls were answered with

    def event(self, key: str) -> asyncio.Event:
        return self.compensated.setdefault(key, asyncio.Event())

    async def forward(self, request: Any) -> Any:
        from aiohttp import ClientSession, web

        body, key = await request.read(), request.headers.get("Idempotency-Key", "")
        undoes = request.headers.get("Undolog-Forward-Key")
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        if undoes is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.event(key).wait(), 60)
        async with (
            ClientSession() as session,
            session.post(self.participant + request.path, data=body, headers=headers) as answer,
        ):
            status, payload = answer.status, await answer.read()
        if undoes is not None:
            self.event(undoes).set()
        else:
            self.late.append(status)
        return web.Response(status=status, body=payload, content_type="application/json")


@pytest.mark.parametrize("participant", ["keys-only", "kit-sqlite", "kit-postgres", "kit-typescript"])
async def test_late_forward_calls_leave_no_effect_under_a_compensated_saga_with_the_kit(
    participant: str, kube: Kube, namespace: str, cluster: Cluster, tmp_path: Path, postgres: LocalPostgres
) -> None:
    """Each saga's forward call times out while a proxy holds it; the saga is compensated (the
    participant finds nothing to undo); then the held call is delivered. Keeping only the
    Idempotency-Key rule, each is applied: an effect nothing will undo under a saga that reads
    Compensated. With the kit's barrier, each is refused 410 and nothing is charged."""
    from aiohttp import web

    from tests.cluster.test_participant_kit import charges, kit_participant, node_participant

    sagas = 100 if FULL else 10
    on_postgres = participant in ("kit-postgres", "kit-typescript")
    database = ["--postgres", postgres.dsn] if on_postgres else ["--sqlite", str(tmp_path / "shop.db")]
    extra = ("--naive",) if participant == "keys-only" else ()
    url = f"postgresql://undolog:{PASSWORD}@127.0.0.1:{postgres.port}/undolog"
    with (
        node_participant("example/example.mjs", url)
        if participant == "kit-typescript"
        else kit_participant(database, *extra)
    ) as base:
        proxy = HoldingProxy(base)
        app = web.Application()
        app.router.add_post("/{path:.*}", proxy.forward)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        operator = OperatorProcess(cluster.kubeconfig, namespace, tmp_path, extra_args=())
        operator.start()
        try:
            for function in ("charge", "refund"):
                hook = webhook(function, url=f"http://127.0.0.1:{port}/{function}")
                hook["spec"]["timeoutSeconds"] = 1
                await kube.create("webhooks", namespace, hook)
            step = {
                "name": "charge",
                "action": {"function": "charge", "args": {"order": "o", "amount": 1}, "maxRetries": 0},
            }
            step["compensation"] = {"function": "refund"}
            for i in range(sagas):
                await kube.create("sagas", namespace, saga(f"late-{i:03d}", [step], compensationPolicy=POLICY))
            await eventually(
                lambda: kube.list("sagas", namespace),
                lambda found: (
                    len(found) == sagas and all(s.get("status", {}).get("phase") == "Compensated" for s in found)
                ),
                300,
                "every saga Compensated",
            )
            await eventually(
                lambda: asyncio.sleep(0, len(proxy.late)), lambda n: n == sagas, 120, "every late call delivered"
            )
        finally:
            operator.stop()
            await runner.cleanup()
        orphans = len(charges(database))
    record(
        f"late_forward_{participant}",
        {"sagas": sagas, "orphan_effects": orphans, "late_calls_refused_410": proxy.late.count(410)},
    )
    if participant == "keys-only":
        assert orphans == sagas  # each late call applied: the defect the barrier exists for
    else:
        assert (orphans, proxy.late.count(410)) == (0, sagas)
