"""Replicas share the sagas (--shards): each shard's sagas and entries are driven by the one
replica holding its Lease; a replica that joins is handed its share, one that is killed has
its shards taken over within the Lease, and nothing is doubled beyond the key rule. The sagas
here are made as `kubectl apply` would (no bucket label), so the operator files them first."""

from __future__ import annotations

import itertools
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.cluster.test_compensation import abort, external_saga, register
from tests.conftest import Cluster
from tests.support.identities import lease_holder
from tests.support.manifests import call
from tests.support.operator_process import OperatorProcess
from tests.support.participants import Participant, Received, Reply
from tests.support.waiting import eventually, saga_phase
from undolog.conventions import BUCKET_LABEL, bucket_of
from undolog.decisions.sharding import all_shards
from undolog.kube import Kube, Plural

pytestmark = pytest.mark.cluster
SHARDS = 4
LEASE_SECONDS = 4
ON_THE_WIRE = 0.1  # seconds a request written just before the kill may take to be read


async def holders(kube: Kube, namespace: str) -> dict[int, str]:
    """Shard index -> the replica holding its Lease ('' when free)."""
    return {index: await lease_holder(kube, namespace, f"undolog-operator-shard-{index}") for index in range(SHARDS)}


def shared(expected: dict[str, int]) -> Callable[[dict[int, str]], bool]:
    return lambda held: Counter(held.values()) == Counter(expected)


async def test_replicas_share_the_shards_and_a_killed_replica_is_finished_by_another(
    kube: Kube, namespace: str, participant: Participant, cluster: Cluster, tmp_path: Path
) -> None:
    a, b = (
        OperatorProcess(
            cluster.kubeconfig, namespace, tmp_path / name, (f"--shards={SHARDS}",), lease_seconds=LEASE_SECONDS
        )
        for name in "ab"
    )
    a.start()
    try:
        await eventually(lambda: holders(kube, namespace), shared({a.identity: 4}), 30, "a alone holding 4 shards")
        joined_at = time.monotonic()
        b.start()
        held = await eventually(
            lambda: holders(kube, namespace), shared({a.identity: 2, b.identity: 2}), 30, "a and b 2 shards each"
        )
        rebalanced = time.monotonic() - joined_at
        of_a = {f"{i}/{SHARDS}" for i, holder in held.items() if holder == a.identity}
        # a's calls are answered slowly, so that a still has work when it is killed: at 0.2 s it
        # had sent all of its shards' calls before the kill (CI: nothing of a's left to take over).
        participant.handle(
            "/undo", lambda request: Reply(200, delay=1.5 if request.headers["undolog-shard"] in of_a else 0.2)
        )
        await register(kube, namespace, participant, "undo")
        sagas = evenly_sharded(namespace, per_shard=6)
        for name in sagas:
            await external_saga(kube, namespace, name, [call("undo", n=p, saga=name) for p in (1, 2, 3)])
        for name in sagas:
            await abort(kube, namespace, name)
        # Both replicas are compensating when a is killed.
        await participant.until(
            lambda received: (
                {r.headers["undolog-shard"] for r in received} >= {f"{i}/{SHARDS}" for i in range(SHARDS)}
                and len(received) >= 16
            ),
            within=60,
        )
        a.kill()
        killed_at = time.monotonic()
        for name in sagas:
            await saga_phase(kube, namespace, name, "Compensated", within=60)
        after = await holders(kube, namespace)
    finally:
        a.stop()
        b.stop()
    received = participant.received("/undo")
    keys = Counter(r.key for r in received)
    taken_over = [r.at - killed_at for r in received if r.headers["undolog-shard"] in of_a and r.at > killed_at]
    print(
        f"\n{SHARDS} shards, lease {LEASE_SECONDS} s: b joined, shares even after {rebalanced:.1f} s; "
        f"a killed, its shards' next call {min(taken_over, default=-1):.1f} s later; "
        f"{len(received)} calls for {len(keys)} keys"
    )
    assert len(keys) == 3 * len(sagas)  # every entry compensated; a repeat only under its own key
    by_saga: dict[str, list[Received]] = defaultdict(list)
    for r in received:
        by_saga[r.body["saga"]].append(r)
    shard_of = {name: next(str(s) for s in all_shards(SHARDS) if s.owns(namespace, name)) for name in sagas}
    for name, calls in by_saga.items():
        assert {r.headers["undolog-shard"] for r in calls} == {shard_of[name]}
        firsts = list(dict.fromkeys(r.body["n"] for r in calls))
        assert firsts == [3, 2, 1], f"{name}: compensated in the order {firsts}"
    assert_one_holder_at_a_time(received, killed_at)
    assert set(after.values()) == {b.identity}  # b took a's shards
    assert taken_over, "nothing of a's shards was sent after a was killed"
    assert min(taken_over) < LEASE_SECONDS + 3


def evenly_sharded(namespace: str, per_shard: int) -> list[str]:
    """Saga names, `per_shard` in each shard. Names picked blindly can leave a shard with none
    (24 names left shard 1 of 4 empty in namespace t-921ff344b5), and then the test cannot see
    both replicas compensating."""
    by_shard: dict[int, list[str]] = defaultdict(list)
    candidates = (f"shared-{i}" for i in itertools.count())
    while min(len(by_shard[s.index]) for s in all_shards(SHARDS)) < per_shard:
        name = next(candidates)
        index = next(s.index for s in all_shards(SHARDS) if s.owns(namespace, name))
        if len(by_shard[index]) < per_shard:
            by_shard[index].append(name)
    return [name for names in by_shard.values() for name in names]


def assert_one_holder_at_a_time(received: list[Received], killed_at: float) -> None:
    """Per shard, a call with a lower fence never arrives after one with a higher fence (beyond
    what was on the wire): the shard's sagas had one sender at a time. The killed replica's
    fences are not seen after its death."""
    by_shard: dict[str, list[Received]] = defaultdict(list)
    for r in sorted(received, key=lambda r: r.at):
        by_shard[r.headers["undolog-shard"]].append(r)
    for shard, calls in by_shard.items():
        highest, highest_at = -1, 0.0
        for r in calls:
            fence = int(r.headers["undolog-fence"])
            if fence < highest:
                assert r.at - highest_at < ON_THE_WIRE, f"shard {shard}: fence {fence} after {highest}"
            if fence > highest:
                highest, highest_at = fence, r.at
        fences = sorted({int(r.headers["undolog-fence"]) for r in calls})
        old = [r for r in calls if int(r.headers["undolog-fence"]) == fences[0] and len(fences) > 1]
        assert all(r.at < killed_at + ON_THE_WIRE for r in old)


async def test_a_saga_and_entries_labelled_into_no_shard_are_filed_and_compensated(
    kube: Kube, namespace: str, participant: Participant, cluster: Cluster, tmp_path: Path
) -> None:
    """A bucket label no shard selects (edited by hand, copied by a tool, written `07` for 7):
    every replica watches only its shards' values, and the filing watch only objects without
    the label, so such a saga was driven by nobody: aborted, it was never compensated."""
    participant.handle("/undo", lambda request: Reply(200))
    await register(kube, namespace, participant, "undo")
    names = ["off-the-map", "zero-padded", "words"]
    for name in names:
        await external_saga(kube, namespace, name, [call("undo", n=p, saga=name) for p in (1, 2)])
    wrong = {"off-the-map": "64", "zero-padded": "", "words": "none"}
    for name, label in wrong.items():
        if not label:  # its own bucket, written with a leading zero
            label = f"0{bucket_of(namespace, name)}"
        await kube.patch("sagas", namespace, name, {"metadata": {"labels": {BUCKET_LABEL: label}}})
        for entry in await kube.list("undoentries", namespace, field_selector=f"spec.saga={name}"):
            await kube.patch(
                "undoentries", namespace, entry["metadata"]["name"], {"metadata": {"labels": {BUCKET_LABEL: label}}}
            )
        await abort(kube, namespace, name)
    operator = OperatorProcess(cluster.kubeconfig, namespace, tmp_path / "op", ("--shards=2",), lease_seconds=4)
    operator.start()
    try:
        for name in names:
            await saga_phase(kube, namespace, name, "Compensated", within=30)
    finally:
        operator.stop()
    for name in names:
        labels = (await kube.get("sagas", namespace, name))["metadata"]["labels"]
        assert labels[BUCKET_LABEL] == str(bucket_of(namespace, name))
        assert [r.body["n"] for r in participant.received("/undo") if r.body["saga"] == name] == [2, 1]


@pytest.mark.parametrize(("plural", "relabelled"), [("undoentries", "relabelled-1"), ("sagas", "relabelled")])
async def test_a_saga_or_entry_relabelled_by_hand_into_another_shard_loses_nothing(
    kube: Kube,
    namespace: str,
    participant: Participant,
    cluster: Cluster,
    tmp_path: Path,
    plural: Plural,
    relabelled: str,
) -> None:
    """A shard's watch selects its buckets' label: an object relabelled out of it (by hand, by
    a tool that rewrites labels) reaches that watch as DELETED, though it still exists. For an
    entry, the saga halted with EntryLost, and a person had to retry one that had lost nothing."""
    participant.handle("/undo", lambda request: Reply(200, delay=1.5 if request.body["n"] == 2 else 0))
    await register(kube, namespace, participant, "undo")
    await external_saga(kube, namespace, "relabelled", [call("undo", n=1), call("undo", n=2)])
    own = bucket_of(namespace, "relabelled")
    other = next(b for b in all_shards(2)[0 if own >= 32 else 1].buckets)  # a bucket of the other shard
    operator = OperatorProcess(cluster.kubeconfig, namespace, tmp_path, ("--shards=2",), lease_seconds=4)
    operator.start()
    try:
        await eventually(
            lambda: kube.get("undoentries", namespace, "relabelled-1"),
            lambda entry: (entry["metadata"].get("labels") or {}).get(BUCKET_LABEL) == str(own),
            30,
            "the entries filed",
        )
        await abort(kube, namespace, "relabelled")
        await participant.until(lambda received: len(received) >= 1, within=30)  # entry 2's call is on the wire
        await kube.patch(plural, namespace, relabelled, {"metadata": {"labels": {BUCKET_LABEL: str(other)}}})
        done = await eventually(
            lambda: kube.get("sagas", namespace, "relabelled"),
            lambda saga: saga.get("status", {}).get("phase") in ("Compensated", "Halted"),
            30,
            "the saga compensated or halted",
        )
    finally:
        operator.stop()
    assert done["status"]["phase"] == "Compensated", done["status"].get("message")
    assert [r.body["n"] for r in participant.received("/undo")] == [2, 1]
