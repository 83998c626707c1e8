"""The operator's series by namespace: those of a namespace where this replica drives no saga
any more go after an hour untouched (CI clusters make a namespace per run: every series of
every namespace ever seen stayed, in memory and in each scrape, for the life of the process);
a namespace with sagas keeps its series however long nothing moves."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from prometheus_client import REGISTRY

from undolog import metrics
from undolog.api import AttemptKind, SagaPhase
from undolog.calls.runner import AttemptRecord
from undolog.controller.gauges import SagaGauges
from undolog.decisions.retry import CallOutcome
from undolog.metrics import IDLE_SECONDS, SWEEP_SECONDS, Series


class Clock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


def sagas(namespace: str) -> float | None:
    return REGISTRY.get_sample_value("undolog_sagas", {"namespace": namespace, "phase": "Active"})


def refunds(namespace: str) -> float | None:
    labels = {"namespace": namespace, "function": "refund", "outcome": "succeeded"}
    return REGISTRY.get_sample_value("undolog_compensation_attempts_total", labels)


def test_the_series_of_a_namespace_without_sagas_go_after_an_hour_and_come_back_with_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock, gauges = Clock(), SagaGauges()
    series = Series(clock)
    series.busy = gauges.busy
    monkeypatch.setattr(metrics, "series", series)
    succeeded = AttemptRecord(1, datetime.now(UTC), CallOutcome(status_code=200), 12)
    gauges.moved("ci-run-1", (None, None), (SagaPhase.ACTIVE, None))
    gauges.moved("long-lived", (None, None), (SagaPhase.ACTIVE, None))  # Active for days, nothing moves
    metrics.attempted(AttemptKind.COMPENSATION, "ci-run-1", "refund", succeeded)
    assert (sagas("ci-run-1"), refunds("ci-run-1")) == (1, 1)

    gauges.moved("ci-run-1", (SagaPhase.ACTIVE, None), (None, None))  # its namespace was deleted
    clock.now += IDLE_SECONDS - 1
    gauges.moved("elsewhere", (None, None), (SagaPhase.ACTIVE, None))
    assert (sagas("ci-run-1"), refunds("ci-run-1")) == (0, 1)  # scrapes still see the last values
    clock.now += SWEEP_SECONDS  # looked at once a minute
    gauges.moved("elsewhere", (SagaPhase.ACTIVE, None), (SagaPhase.COMPLETED, None))
    assert (sagas("ci-run-1"), refunds("ci-run-1")) == (None, None)
    assert "ci-run-1" not in series.namespaces()
    assert "ci-run-1" not in {namespace for namespace, _ in gauges.by_phase}
    assert sagas("long-lived") == 1  # untouched for an hour, but it has a saga

    gauges.moved("ci-run-1", (None, None), (SagaPhase.ACTIVE, None))  # the name is used again
    assert sagas("ci-run-1") == 1
