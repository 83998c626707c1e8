"""Prometheus metrics of the operator (served on --metrics-port at /metrics).

Every series carries `namespace` (and `function` where a call is counted), so alerts and
dashboards can say where a person is needed. Saga gauges count the sagas of the shards this
replica holds (the replicas' sum is every saga, none twice); a standby reports
`undolog_leader 0` and nothing else about sagas. No `*_created` series.
"""

from __future__ import annotations

import prometheus_client
from prometheus_client import Counter, Gauge, Histogram

from undolog.api import AttemptKind

prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]

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
sagas_by_phase = Gauge("undolog_sagas", "Sagas this operator drives, by phase.", ["namespace", "phase"])
halted_sagas = Gauge(
    "undolog_halted_sagas",
    "Sagas waiting for a person in phase Halted, by the function they wait on ('' when none, e.g. a lost entry).",
    ["namespace", "function"],
)
compensation_attempts = Counter(
    "undolog_compensation_attempts_total",
    "Compensation calls by outcome (succeeded, transient, permanent) and function.",
    ["namespace", "function", "outcome"],
)
compensation_seconds = Histogram(
    "undolog_compensation_duration_seconds",
    "Wall time of one compensation call attempt.",
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


BY_KIND: dict[AttemptKind, tuple[Counter, Histogram]] = {
    AttemptKind.FORWARD: (forward_attempts, forward_seconds),
    AttemptKind.COMPENSATION: (compensation_attempts, compensation_seconds),
    AttemptKind.EFFECT: (effect_attempts, effect_seconds),
}


def attempts(kind: AttemptKind) -> Counter:
    return BY_KIND[kind][0]


def seconds(kind: AttemptKind) -> Histogram:
    return BY_KIND[kind][1]
