"""Two operators started alike (by mistake, or as replicas) never both send: one holds the
Lease, every call carries its fencing token (Undolog-Fence), and a leader frozen with SIGSTOP
and resumed after a standby took over sends nothing new."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.cluster.test_compensation import abort, external_saga, register
from tests.conftest import Cluster
from tests.support.identities import lease_holder
from tests.support.manifests import call
from tests.support.operator_process import OperatorProcess
from tests.support.participants import Participant, Reply
from tests.support.waiting import eventually, saga_phase
from undolog.kube import Kube

pytestmark = pytest.mark.cluster
ON_THE_WIRE = 0.1  # seconds a request sent at the moment of SIGSTOP may take to be read


async def holder(kube: Kube, namespace: str) -> str:
    return await lease_holder(kube, namespace, "undolog-operator")


async def test_two_operators_started_alike_send_each_compensation_once(
    kube: Kube, namespace: str, participant: Participant, cluster: Cluster, tmp_path: Path
) -> None:
    operators = [OperatorProcess(cluster.kubeconfig, namespace, tmp_path / name, extra_args=()) for name in "ab"]
    for operator in operators:
        operator.start()
    try:
        await register(kube, namespace, participant, "undo")
        sagas = [f"two-{i}" for i in range(34)]
        for name in sagas:
            await external_saga(kube, namespace, name, [call("undo", n=p) for p in (1, 2, 3)])
        for name in sagas:
            await abort(kube, namespace, name)
        for name in sagas:
            await saga_phase(kube, namespace, name, "Compensated", within=60)
    finally:
        for operator in operators:
            operator.stop()
    received = participant.received()
    keys = Counter(r.key for r in received)
    duplicates = sum(n - 1 for n in keys.values())
    print(f"\ntwo operators, {len(keys)} entries: {len(received)} calls, {duplicates} duplicates")
    assert len(keys) == 102
    assert duplicates == 0
    assert len({r.headers["undolog-fence"] for r in received}) == 1  # one holder sent them all


async def test_a_frozen_leader_resumed_after_a_hand_over_sends_nothing_new(
    kube: Kube, namespace: str, participant: Participant, cluster: Cluster, tmp_path: Path
) -> None:
    participant.handle("/undo", lambda request: Reply(200, delay=0.3))
    operators = [OperatorProcess(cluster.kubeconfig, namespace, tmp_path / name) for name in "ab"]
    for operator in operators:
        operator.start()
    stopped: OperatorProcess | None = None
    try:
        await register(kube, namespace, participant, "undo")
        first = await eventually(lambda: holder(kube, namespace), lambda h: h != "", 30, "a leader")
        leader = next(o for o in operators if o.identity == first)
        sagas = [f"frozen-{i}" for i in range(12)]
        for name in sagas:
            await external_saga(kube, namespace, name, [call("undo", n=p) for p in (1, 2)])
        for name in sagas:
            await abort(kube, namespace, name)
        await participant.until(lambda received: len(received) >= 3)
        assert leader.process is not None
        os.kill(leader.process.pid, signal.SIGSTOP)
        stopped, stopped_at = leader, time.monotonic()
        second = await eventually(lambda: holder(kube, namespace), lambda h: h not in ("", first), 30, "hand-over")
        handed_over = time.monotonic() - stopped_at
        for name in sagas:
            await saga_phase(kube, namespace, name, "Compensated", within=60)
        os.kill(leader.process.pid, signal.SIGCONT)
        resumed_at = time.monotonic()
        stopped = None
        # It finds on waking that it may not send; then that the Lease is another's.
        await eventually(
            lambda: _logged(leader, "lost the Lease"), lambda seen: seen, 30, "the old leader stepping down"
        )
    finally:
        if stopped is not None and stopped.process is not None:
            os.kill(stopped.process.pid, signal.SIGCONT)
        for operator in operators:
            operator.stop()
    received = participant.received()
    fences = Counter(r.headers["undolog-fence"] for r in received)
    old, new = sorted(fences, key=int)
    # A request written just before the stop may be read by the participant just after it.
    late = [r for r in received if r.headers["undolog-fence"] == old and r.began > stopped_at + ON_THE_WIRE]
    # A request frozen mid-way, its body's write past the fence check, ends when the process wakes:
    # no client can make the check and the send one step (seen twice in `make test`, its body read
    # at +0.000 s from the resume, while writes checked after the resume were refused). It carries
    # the old fence, which a participant that keeps the highest fence refuses.
    ended_late = [r for r in received if r.headers["undolog-fence"] == old and r.at > stopped_at + ON_THE_WIRE]
    print(
        f"\nhand-over {handed_over:.1f} s after SIGSTOP (lease 4 s); fences {dict(fences)}; "
        f"calls from the old leader begun over {ON_THE_WIRE} s after it was stopped: {len(late)}; "
        f"begun before and ended at its resume: {[f'{r.at - resumed_at:+.3f} s' for r in ended_late]}"
    )
    assert int(new) > int(old)
    assert second != first
    # Nothing new from the frozen leader, neither while stopped nor once resumed.
    assert late == [], [
        f"{r.key} begun {r.began - stopped_at:.3f} s after the stop, {r.began - resumed_at:+.3f} s from the resume"
        for r in late
    ]
    assert all(r.began < resumed_at or r.headers["undolog-fence"] == new for r in received)
    keys = Counter(r.key for r in received)
    assert len(keys) == 24  # every entry compensated; a repeat only under its own key


async def _logged(operator: OperatorProcess, text: str) -> bool:
    return text in operator.log()


async def test_a_stopped_operator_hands_its_lease_back_with_nothing_left_running(
    kube: Kube, namespace: str, cluster: Cluster, tmp_path: Path
) -> None:
    """SIGTERM (a rollout, a drain): UndoLog's own work is stopped in kopf's cleanup, so that kopf
    finds no task of ours still running (it would wait 5 s for them before exiting), and the
    Lease is free when the process is gone, for a standby to take at once."""
    operator = OperatorProcess(cluster.kubeconfig, namespace, tmp_path)
    operator.start()
    try:
        await eventually(lambda: holder(kube, namespace), lambda h: h == operator.identity, 30, "leading")
    finally:
        operator.stop()
    assert operator.process is not None
    assert operator.process.returncode == 0
    assert await holder(kube, namespace) == ""
    log = operator.log()
    assert "Hung tasks stopping is skipped: no tasks given" in log, log[-3000:]


async def test_a_lease_deleted_by_hand_gives_a_higher_fence_not_zero_again(
    kube: Kube, namespace: str, participant: Participant, cluster: Cluster, tmp_path: Path
) -> None:
    """`kubectl delete lease` started the transition count (the fence) again at 0: the holder
    after it sent with a lower fence than the one before, which a participant keeping the
    highest fence refuses for good."""
    await register(kube, namespace, participant, "undo")
    operator = OperatorProcess(cluster.kubeconfig, namespace, tmp_path)
    fences: list[int] = []

    async def compensated(name: str) -> None:
        await external_saga(kube, namespace, name, [call("undo", saga=name)])
        await abort(kube, namespace, name)
        await saga_phase(kube, namespace, name, "Compensated", within=30)
        fences.append(int(next(r for r in participant.received() if r.body["saga"] == name).headers["undolog-fence"]))

    operator.start()
    try:
        await compensated("first")
        operator.stop()
        operator.start()  # the same pod's new process: a new fence
        await compensated("restarted")
        lease = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/undolog-operator"
        await kube.request("DELETE", lease)
        await eventually(lambda: holder(kube, namespace), lambda held: held == operator.identity, 30, "the Lease again")
        await compensated("after-the-delete")
    finally:
        operator.stop()
    print(f"\nfences: {fences}")
    assert fences[0] < fences[1] < fences[2]
