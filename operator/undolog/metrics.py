"""Prometheus metrics of the operator (served on --metrics-port at /metrics).

Every series carries `namespace` (and `function` where a call is counted), so alerts and
dashboards can say where a person is needed. Saga gauges count the sagas of the shards this
replica holds (the replicas' sum is every saga, none twice); a standby reports
`undolog_leader 0` and nothing else about sagas. No `*_created` series.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from typing import TypeVar

import prometheus_client
from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

from undolog.api import AttemptKind
from undolog.calls.runner import AttemptRecord

prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]

IDLE_SECONDS = 3600.0  # a namespace's series go once none was touched and it had no saga for this long
SWEEP_SECONDS = 60.0
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

leader = Gauge("undolog_leader", "1 while this operator holds a Lease (of one shard or more) and drives sagas, else 0.")
shards_held = Gauge("undolog_shards_held", "How many shards' Leases this operator holds (their sagas it drives).")
_held = 0


def holding(change: int) -> None:
    """A shard's Lease taken (+1) or given up (-1)."""
    global _held
    _held += change
    shards_held.set(_held)
    leader.set(1 if _held else 0)


saga_transitions = Counter(
    "undolog_saga_transitions_total", "Sagas entering a phase.", ["namespace", "phase", "reason"]
)
entry_proofs = Counter(
    "undolog_entry_proofs_total",
    "Proofs that a saga's entries are all known, by source: TakingCharge (the entry listing taken "
    "on taking charge), Watch (the entry watch's progress past the saga's own entry write), "
    "WriteEcho (the entry watch's echo of an entry write sent after the proof began, any saga's) "
    "or List (a LIST of the saga's entries, which scans every entry of its namespace in the apiserver).",
    ["namespace", "source"],
)
stored_again = Counter(
    "undolog_storage_migrated_objects_total",
    "Objects written again in the storage version (stored by an earlier release in an earlier one).",
    ["resource"],
)
retention_deletions = Counter(
    "undolog_retention_deletions_total",
    "Finished sagas deleted by retention (their TTL ran out, or their namespace held more than the cap).",
    ["namespace", "phase"],
)
archived_sagas = Counter("undolog_archived_sagas_total", "Finished sagas written to the archive (PostgreSQL).")
archive_backlog = Gauge(
    "undolog_archive_backlog_sagas", "Finished sagas waiting to be archived (none is deleted before it is)."
)
archive_backlog_seconds = Gauge(
    "undolog_archive_backlog_seconds", "How long the oldest finished saga waiting to be archived has waited (0: none)."
)
archive_refused = Counter(
    "undolog_archive_refused_sagas_total",
    "Rows of finished sagas the archive refused to write: their entries were not all there (each logged by name).",
)
archive_incomplete = Gauge(
    "undolog_archive_incomplete_sagas",
    "Finished sagas kept in etcd, not archived: their entries cannot be proven complete (each logged by name).",
)
archive_partial_rows = Gauge(
    "undolog_archive_partial_rows",
    "Archived rows found missing entries whose saga is gone from etcd (each logged by name; undolog archive check).",
)
archive_events_dropped = Counter(
    "undolog_archive_events_dropped_total",
    "Events not kept for the archive: more than 100,000 waited while PostgreSQL could not be reached.",
)
sagas_by_phase = Gauge("undolog_sagas", "Sagas this operator drives, by phase.", ["namespace", "phase"])
halted_sagas = Gauge(
    "undolog_halted_sagas",
    "Sagas waiting for a person in phase Halted, by the function they wait on ('' when none, e.g. a lost entry).",
    ["namespace", "function"],
)
participant_unavailable = Gauge(
    "undolog_participant_unavailable",
    "1 while a participant's breaker is open (it did not answer several calls in a row; calls wait), else 0.",
    ["namespace", "webhook"],
)
compensation_attempts = Counter(
    "undolog_compensation_attempts_total",
    "Compensation calls by outcome (succeeded, transient, permanent) and function.",
    ["namespace", "function", "outcome"],
)
compensation_seconds = Histogram(
    "undolog_compensation_call_duration_seconds",
    "Wall time of one compensation call attempt.",
    ["namespace", "function"],
    buckets=LATENCY_BUCKETS,
)
# The same, under its name of 0.3 (unlike the forward and effect calls'): kept this release, then removed.
compensation_seconds_deprecated = Histogram(
    "undolog_compensation_duration_seconds",
    "Deprecated: undolog_compensation_call_duration_seconds (the same), removed in the next release.",
    ["namespace", "function"],
    buckets=LATENCY_BUCKETS,
)
forward_seconds = Histogram(
    "undolog_forward_call_duration_seconds",
    "Wall time of one forward call attempt.",
    ["namespace", "function"],
    buckets=LATENCY_BUCKETS,
)
forward_attempts = Counter(
    "undolog_forward_attempts_total", "Forward calls by outcome and function.", ["namespace", "function", "outcome"]
)
effect_seconds = Histogram(
    "undolog_effect_call_duration_seconds",
    "Wall time of one post-commit effect call attempt.",
    ["namespace", "function"],
    buckets=LATENCY_BUCKETS,
)
effect_attempts = Counter(
    "undolog_effect_attempts_total",
    "Post-commit effect calls by outcome and function.",
    ["namespace", "function", "outcome"],
)
guard_attempts = Counter(
    "undolog_guard_attempts_total",
    "Reads of what a step left, before its compensation (guards), by outcome and function.",
    ["namespace", "function", "outcome"],
)
guard_seconds = Histogram(
    "undolog_guard_call_duration_seconds",
    "Wall time of one guard read attempt.",
    ["namespace", "function"],
    buckets=LATENCY_BUCKETS,
)


BY_KIND: dict[AttemptKind, tuple[Counter, Histogram]] = {
    AttemptKind.FORWARD: (forward_attempts, forward_seconds),
    AttemptKind.COMPENSATION: (compensation_attempts, compensation_seconds),
    AttemptKind.EFFECT: (effect_attempts, effect_seconds),
    AttemptKind.GUARD: (guard_attempts, guard_seconds),
}


def attempts(kind: AttemptKind) -> Counter:
    return BY_KIND[kind][0]


def attempted(kind: AttemptKind, namespace: str, function: str, record: AttemptRecord) -> None:
    """One attempt of a call: counted by outcome, and its wall time."""
    counted, timed = BY_KIND[kind]
    series.of(counted, namespace, function, record.verdict.lower()).inc()
    series.of(timed, namespace, function).observe(record.duration_milliseconds / 1000)
    if kind == AttemptKind.COMPENSATION:
        series.of(compensation_seconds_deprecated, namespace, function).observe(record.duration_milliseconds / 1000)


M = TypeVar("M", bound=MetricWrapperBase)


class Series:
    """Every series is made here, by namespace, so that those of a namespace go once it has had
    no saga driven by this replica, and no series touched, for IDLE_SECONDS: clusters that make a
    namespace per CI run kept every series of every namespace ever seen, in memory and in each
    scrape, for the life of the process (a few KiB per namespace and function). The hour lets
    scrapes see a series' last value; a counter that comes back starts again, which rate() and
    increase() read as a reset."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.busy: Callable[[str], bool] = lambda namespace: False  # it has sagas (the gauges say)
        self._made: defaultdict[str, set[tuple[MetricWrapperBase, tuple[str, ...]]]] = defaultdict(set)
        self._touched: dict[str, float] = {}
        self._swept = clock()

    def of(self, metric: M, namespace: str, *labels: str) -> M:
        """`metric.labels(namespace, *labels)`, remembered for its namespace."""
        now = self.clock()
        if now - self._swept >= SWEEP_SECONDS:
            self.sweep(now)
        values = (namespace, *labels)
        self._made[namespace].add((metric, values))
        self._touched[namespace] = now
        return metric.labels(*values)

    def sweep(self, now: float) -> None:
        self._swept = now
        for namespace, touched in list(self._touched.items()):
            if now - touched >= IDLE_SECONDS and not self.busy(namespace):
                for metric, values in self._made.pop(namespace, set()):
                    metric.remove(*values)
                del self._touched[namespace]

    def namespaces(self) -> set[str]:
        return set(self._made)


series = Series()
