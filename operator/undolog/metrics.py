"""Prometheus metrics of the operator (served on --metrics-port at /metrics)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

saga_transitions = Counter("undolog_saga_transitions_total", "Sagas entering a phase.", ["phase", "reason"])
sagas_by_phase = Gauge("undolog_sagas", "Sagas this operator has seen, by phase.", ["phase"])
halted_sagas = Gauge("undolog_halted_sagas", "Sagas waiting for a person in phase Halted.")
compensation_attempts = Counter(
    "undolog_compensation_attempts_total",
    "Compensation calls by outcome (succeeded, transient, permanent) and function.",
    ["function", "outcome"],
)
compensation_seconds = Histogram(
    "undolog_compensation_duration_seconds",
    "Wall time of one compensation call attempt.",
    ["function"],
    buckets=LATENCY_BUCKETS,
)
forward_seconds = Histogram(
    "undolog_forward_call_duration_seconds",
    "Wall time of one forward call attempt.",
    ["function"],
    buckets=LATENCY_BUCKETS,
)
forward_attempts = Counter(
    "undolog_forward_attempts_total", "Forward calls by outcome and function.", ["function", "outcome"]
)
effect_attempts = Counter(
    "undolog_effect_attempts_total", "Post-commit effect calls by outcome and function.", ["function", "outcome"]
)
