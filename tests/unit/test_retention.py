"""When a finished saga leaves etcd (decisions.retention): its TTL from its completion time, the
per-namespace cap oldest first, and never a saga that is not finished."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from undolog.api import Saga, SagaPhase
from undolog.conventions import FINALIZER
from undolog.decisions import retention
from undolog.decisions.retention import Finished, RetentionPolicy

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def saga(
    phase: SagaPhase | None,
    *,
    ttl: int | None = None,
    finalizer: bool = False,
    done: datetime = T0,
    expires: datetime | None = None,
) -> Saga:
    status = {"phase": phase, "completionTime": done.isoformat()} if phase else {}
    if expires is not None:
        status["expiresAt"] = expires.isoformat()
    return Saga.model_validate(
        {
            "metadata": {
                "name": "s",
                "namespace": "ns",
                "uid": "u",
                "resourceVersion": "7",
                "finalizers": [FINALIZER] if finalizer else [],
            },
            "spec": {"ttlSecondsAfterFinished": ttl} if ttl is not None else {},
            "status": status,
        }
    )


def test_the_sagas_own_ttl_overrides_the_default_for_its_phase() -> None:
    policy = RetentionPolicy(completed=timedelta(hours=1), compensated=timedelta(days=7))
    own = saga(SagaPhase.COMPLETED, ttl=60)
    assert retention.expires_at(own, SagaPhase.COMPLETED, T0, policy) == T0 + timedelta(seconds=60)
    default = saga(SagaPhase.COMPENSATED)
    assert retention.expires_at(default, SagaPhase.COMPENSATED, T0, policy) == T0 + timedelta(days=7)
    kept = saga(SagaPhase.COMPLETED)
    assert retention.expires_at(kept, SagaPhase.COMPLETED, T0, RetentionPolicy()) is None


def test_a_saga_is_due_when_its_status_says_and_a_status_that_says_otherwise_is_stamped_again() -> None:
    """One deletion time: what status.expiresAt says (every view shows it). An edited TTL, or
    other defaults, stamp it again; until then the saga is judged by nothing else."""
    policy = RetentionPolicy(completed=timedelta(hours=1))
    stamped = saga(SagaPhase.COMPLETED, expires=T0 + timedelta(hours=1))
    record = retention.finished(stamped)
    assert record is not None
    assert record.expires_at == T0 + timedelta(hours=1)
    assert retention.restamp(stamped, policy) is None
    edited = saga(SagaPhase.COMPLETED, ttl=60, expires=T0 + timedelta(hours=1))
    again = retention.restamp(edited, policy)
    assert again is not None
    assert (again.saga, again.expires_at) == (retention.finished(edited), T0 + timedelta(seconds=60))
    kept_now = retention.restamp(stamped, RetentionPolicy())  # the operator restarted without a default
    assert kept_now is not None
    assert kept_now.expires_at is None
    assert retention.restamp(saga(SagaPhase.HALTED, ttl=0), policy) is None


def test_halted_unfinished_and_finalized_sagas_are_never_retained() -> None:
    for phase in (SagaPhase.HALTED, SagaPhase.ACTIVE, SagaPhase.COMPENSATING, SagaPhase.REWINDING, None):
        assert retention.finished(saga(phase, ttl=0)) is None
    assert retention.finished(saga(SagaPhase.COMPLETED, ttl=0, finalizer=True)) is None


def finished(name: str, namespace: str, done: datetime, expires: datetime | None) -> Finished:
    return Finished(namespace, name, f"uid-{name}", "1", SagaPhase.COMPLETED, done, expires)


def test_due_by_ttl_and_the_next_wake_is_the_earliest_expiry() -> None:
    sagas = [
        finished("a", "ns", T0, T0 + timedelta(minutes=5)),
        finished("b", "ns", T0, T0 + timedelta(minutes=10)),
        finished("c", "ns", T0, None),
    ]
    plan = retention.plan(sagas, RetentionPolicy(), T0 + timedelta(minutes=6))
    assert [d.saga.name for d in plan.due] == ["a"]
    assert plan.next_at == T0 + timedelta(minutes=10)


def test_the_cap_deletes_the_oldest_of_each_namespace_and_counts_a_shards_share() -> None:
    sagas = [finished(f"s{i}", ns, T0 + timedelta(seconds=i), None) for ns in ("x", "y") for i in range(5)]
    plan = retention.plan(sagas, RetentionPolicy(max_finished=3), T0)
    gone = sorted((d.saga.namespace, d.saga.name) for d in plan.due)
    assert gone == [("x", "s0"), ("x", "s1"), ("y", "s0"), ("y", "s1")]
    shared = retention.plan(sagas, RetentionPolicy(max_finished=3, shards=2), T0)  # each shard keeps ceil(3/2)
    assert len(shared.due) == 6


TTL = st.one_of(st.none(), st.integers(0, 1000))


@given(
    st.lists(st.tuples(st.integers(0, 1000), TTL, st.sampled_from("ab")), max_size=40),
    st.one_of(st.none(), st.integers(0, 10)),
    st.integers(0, 1000),
)
def test_plan_properties(raw: list[tuple[int, int | None, str]], cap: int | None, at: int) -> None:
    now = T0 + timedelta(seconds=at)
    sagas = [
        finished(f"s{i}", ns, T0 + timedelta(seconds=done), None if ttl is None else T0 + timedelta(seconds=done + ttl))
        for i, (done, ttl, ns) in enumerate(raw)
    ]
    plan = retention.plan(sagas, RetentionPolicy(max_finished=cap), now)
    due = {d.saga.key for d in plan.due}
    assert len(due) == len(plan.due)  # each at most once
    for ns in "ab":
        kept = [s for s in sagas if s.namespace == ns and s.key not in due]
        if cap is not None:
            assert len(kept) <= cap
        gone = [s for s in sagas if s.namespace == ns and s.key in due]
        for s in gone:  # what goes is expired, or older than everything kept
            expired = s.expires_at is not None and s.expires_at <= now
            assert expired or all((s.completed_at, s.name) <= (k.completed_at, k.name) for k in kept)
        for s in kept:
            assert s.expires_at is None or s.expires_at > now
            assert plan.next_at is not None and plan.next_at <= s.expires_at if s.expires_at else True
    assert [d.saga.completed_at for d in plan.due] == sorted(d.saga.completed_at for d in plan.due)
