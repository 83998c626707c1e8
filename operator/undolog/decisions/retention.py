"""Retention: when a finished saga leaves etcd.

A saga is finished once it is Completed or Compensated and its finalizer is released. It is
due at its `status.expiresAt` and at no other time: `expires_at` computes it, `ttl` after its
`status.completionTime` (the saga's own `spec.ttlSecondsAfterFinished`, else the operator's
default for its phase; none: kept), and a status that says otherwise (the TTL edited, the
operator's defaults changed) is stamped again (`restamp`) before it is judged. A namespace
keeps at most `max_finished` finished sagas (per shard, its share of them); past that the
oldest are due at once. Halted and unfinished sagas are never due: a Halted saga a person
resolves finishes then, and its clock starts then. Everything here is computed from what the
saga's status says, so it survives restarts, leader changes and shard moves.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from undolog.api import TERMINAL, Saga, SagaPhase
from undolog.conventions import FINALIZER, shown_duration

# Kept at least this long, a finished saga's entries are worth one write each to drop their
# field owners (metadata.managedFields: ~840 of an entry's ~1,900 bytes in etcd).
KEPT_LONG = timedelta(hours=1)


@dataclass(frozen=True)
class RetentionPolicy:
    """The operator's defaults (`undolog operator --ttl-completed ...`; chart `retention.*`)."""

    completed: timedelta | None = None  # kept this long after Completed; None: until the cap
    compensated: timedelta | None = None
    max_finished: int | None = None  # finished sagas kept per namespace, oldest deleted first
    shards: int = 1  # each shard keeps its share of max_finished

    def default_for(self, phase: SagaPhase) -> timedelta | None:
        return self.completed if phase == SagaPhase.COMPLETED else self.compensated

    @property
    def kept_per_shard(self) -> int | None:
        if self.max_finished is None:
            return None
        return math.ceil(self.max_finished / self.shards)


@dataclass(frozen=True)
class Finished:
    """What retention needs of a finished saga (small: one is kept per finished saga)."""

    namespace: str
    name: str
    uid: str
    resource_version: str
    phase: SagaPhase
    completed_at: datetime
    expires_at: datetime | None  # when it is due by its TTL; None: kept until the cap

    @property
    def key(self) -> tuple[str, str]:
        return self.namespace, self.name


def expires_at(saga: Saga, phase: SagaPhase, completed_at: datetime, policy: RetentionPolicy) -> datetime | None:
    """When a saga that finished in `phase` at `completed_at` is due by its TTL."""
    seconds = saga.spec.ttl_seconds_after_finished
    ttl = timedelta(seconds=seconds) if seconds is not None else policy.default_for(phase)
    return None if ttl is None else completed_at + ttl


def kept_long(saga: Saga) -> bool:
    """Whether a finished saga stays in etcd at least KEPT_LONG (its status.expiresAt says)."""
    status = saga.status
    if status.expires_at is None or status.completion_time is None:
        return True
    return status.expires_at - status.completion_time >= KEPT_LONG


def finished(saga: Saga) -> Finished | None:
    """The saga as retention sees it, due when its status says; None while it is not finished
    (not Completed or Compensated, a finalizer still held, a person's request pending, being
    deleted)."""
    status, meta = saga.status, saga.metadata
    if status.phase not in TERMINAL or status.completion_time is None:
        return None
    if FINALIZER in meta.finalizers or meta.deletion_timestamp is not None:
        return None
    return Finished(
        namespace=meta.namespace,
        name=meta.name,
        uid=meta.uid,
        resource_version=meta.resource_version,
        phase=status.phase,
        completed_at=status.completion_time,
        expires_at=status.expires_at,
    )


@dataclass(frozen=True)
class Restamp:
    """A finished saga whose status.expiresAt is not what its TTL and the defaults make it."""

    saga: Finished
    expires_at: datetime | None  # what status.expiresAt should say (None: kept, but for the cap)


def restamp(saga: Saga, policy: RetentionPolicy) -> Restamp | None:
    """The due time to stamp on a finished saga, when its status says another."""
    record = finished(saga)
    if record is None:
        return None
    wanted = expires_at(saga, record.phase, record.completed_at, policy)
    return None if wanted == record.expires_at else Restamp(record, wanted)


@dataclass(frozen=True)
class Due:
    saga: Finished
    why: str  # for the log and the Event: "its TTL (1h) ran out", "over the cap of 100"


@dataclass(frozen=True)
class RetentionPlan:
    due: list[Due] = field(default_factory=list)  # oldest first
    next_at: datetime | None = None  # the next time something falls due (None: nothing will)


def plan(sagas: Iterable[Finished], policy: RetentionPolicy, now: datetime) -> RetentionPlan:
    """What is due now, oldest first, and when the next one falls due."""
    by_namespace: dict[str, list[Finished]] = defaultdict(list)
    for saga in sagas:
        by_namespace[saga.namespace].append(saga)
    due: list[Due] = []
    upcoming: list[datetime] = []
    kept = policy.kept_per_shard
    for namespace_sagas in by_namespace.values():
        namespace_sagas.sort(key=lambda s: (s.completed_at, s.name))
        over = max(len(namespace_sagas) - kept, 0) if kept is not None else 0
        for index, saga in enumerate(namespace_sagas):
            if index < over:
                due.append(Due(saga, f"over the cap of {policy.max_finished} finished sagas per namespace"))
            elif saga.expires_at is not None and saga.expires_at <= now:
                due.append(Due(saga, f"finished {shown_duration(now - saga.completed_at)} ago, past its TTL"))
            elif saga.expires_at is not None:
                upcoming.append(saga.expires_at)
    due.sort(key=lambda d: (d.saga.completed_at, d.saga.key))
    return RetentionPlan(due, min(upcoming, default=None))
