"""`make alerts`: the chart's alerts evaluated by a real Prometheus (built from the Go module proxy
by `make bin/prometheus`) against a real scrape of the operator, configured as
prometheus-operator configures the chart's ServiceMonitor: the target labelled with the
operator's own namespace, `honor_labels` from the endpoint's `honorLabels`. With it, a halted
saga's alert names the saga's namespace; without it (the second job), Prometheus renames the
saga's label `exported_namespace` and the alert names the operator's namespace instead."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from devtools.control_plane.local import free_port

from tests.cluster.test_cli import halted_saga
from tests.cluster.test_compensation import abort, register
from tests.cluster.test_packaging import rendered
from tests.conftest import BIN, Cluster
from tests.support.manifests import call, saga, undo_entry
from tests.support.operator_process import OperatorProcess
from tests.support.owner_policy import owner_policy_off
from tests.support.participants import Participant
from tests.support.waiting import eventually, saga_phase, serving
from undolog.kube import Kube

pytestmark = pytest.mark.cluster
OPERATOR_NAMESPACE = "undolog-system"  # where the chart runs it: what the scrape's target says
CAMEL = {"sourceLabels": "source_labels", "targetLabel": "target_label", "replacement": "replacement"}


def snake(relabeling: dict[str, Any]) -> dict[str, Any]:
    """A ServiceMonitor relabeling as Prometheus's configuration spells it."""
    return {CAMEL.get(key, key): value for key, value in relabeling.items()}


def scrape_job(name: str, target: str, endpoint: dict[str, Any], *, honor_labels: bool) -> dict[str, Any]:
    """The job prometheus-operator writes for the endpoint (its service discovery replaced by
    the one target, with the labels its relabeling gives: namespace, service, job)."""
    return {
        "job_name": name,
        "scrape_interval": "1s",  # the chart's 30s, shortened for the test
        "honor_labels": honor_labels,
        "static_configs": [
            {"targets": [target], "labels": {"namespace": OPERATOR_NAMESPACE, "service": "undolog", "job": name}}
        ],
        "relabel_configs": [snake(r) for r in endpoint.get("relabelings", [])],
        "metric_relabel_configs": [snake(r) for r in endpoint.get("metricRelabelings", [])],
    }


@pytest.fixture
def prometheus(operator: OperatorProcess, tmp_path: Path) -> Iterator[str]:
    """Prometheus scraping the operator as the chart's ServiceMonitor has it, and, in a second
    job, as it would without honorLabels; the chart's PrometheusRule loaded as its rule file."""
    values = ("metrics.serviceMonitor.enabled=true", "metrics.prometheusRule.enabled=true")
    objects = {d["kind"]: d for d in rendered(*values)}
    [endpoint] = objects["ServiceMonitor"]["spec"]["endpoints"]
    assert endpoint["honorLabels"] is True
    groups = objects["PrometheusRule"]["spec"]["groups"]
    for rule in (r for g in groups for r in g["rules"]):
        rule.pop("for", None)  # firing at once: the expression is what is checked, not the chart's patience
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    target = f"127.0.0.1:{operator.metrics_port}"
    config = {
        "global": {"evaluation_interval": "1s"},
        "rule_files": [str(tmp_path / "rules.yaml")],
        "scrape_configs": [
            scrape_job("as-the-chart-has-it", target, endpoint, honor_labels=True),
            scrape_job("without-honor-labels", target, endpoint, honor_labels=False),
        ],
    }
    (tmp_path / "prometheus.yaml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = (tmp_path / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [
            str(BIN / "prometheus"),
            f"--config.file={tmp_path / 'prometheus.yaml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    serving(f"{url}/-/ready", process, tmp_path / "prometheus.log", 60)
    try:
        yield url
    finally:
        process.terminate()
        process.wait(timeout=15)
        log.close()


async def series(url: str, query: str) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(timeout=10) as client:
        answer = await client.get(f"{url}/api/v1/query", params={"query": query})
    answer.raise_for_status()
    return list(answer.json()["data"]["result"])


async def alerts(url: str) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(timeout=10) as client:
        answer = await client.get(f"{url}/api/v1/alerts")
    return [a for a in answer.json()["data"]["alerts"] if a["state"] == "firing"]


async def test_a_halted_saga_s_alert_names_its_namespace_through_the_service_monitor_s_scrape(
    kube: Kube, namespace: str, participant: Participant, prometheus: str
) -> None:
    await halted_saga(kube, namespace, participant)
    kept = '{job="as-the-chart-has-it"}'
    scraped = await eventually(
        lambda: series(prometheus, f"undolog_halted_sagas{kept} > 0"), bool, 30, "the halted saga scraped"
    )
    print(f"\nscraped (honor_labels: true): {[s['metric'] for s in scraped]}")
    assert [s["metric"]["namespace"] for s in scraped] == [namespace]

    expression = "sum by (namespace, function) (undolog_halted_sagas) > 0"
    evaluated = await series(prometheus, expression.replace("undolog_halted_sagas", "undolog_halted_sagas" + kept))
    print(f"{expression} -> {[(s['metric'], s['value'][1]) for s in evaluated]}")
    assert [(s["metric"]["namespace"], s["metric"]["function"]) for s in evaluated] == [(namespace, "revoke")]

    # The same scrape without honorLabels: the saga's namespace is renamed and the alert's is the operator's.
    renamed = await eventually(
        lambda: series(prometheus, 'undolog_halted_sagas{job="without-honor-labels"} > 0'), bool, 30, "scraped"
    )
    print(f"scraped (honor_labels: false): {[s['metric'] for s in renamed]}")
    assert [(s["metric"]["namespace"], s["metric"]["exported_namespace"]) for s in renamed] == [
        (OPERATOR_NAMESPACE, namespace)
    ]

    firing = await eventually(
        lambda: alerts(prometheus),
        lambda found: len([a for a in found if a["labels"]["alertname"] == "UndoLogSagaHalted"]) == 2,
        30,
        "UndoLogSagaHalted firing",
    )
    halted = [a for a in firing if a["labels"]["alertname"] == "UndoLogSagaHalted"]
    for alert in halted:
        print(f"firing: {alert['labels']} {alert['annotations']['summary']}")
    summaries = {a["annotations"]["summary"] for a in halted}
    assert f"1 saga(s) halted in {namespace}, waiting on revoke" in summaries
    assert all(a["annotations"]["runbook_url"].endswith("/docs/runbook.md#undologsagahalted") for a in halted)
    assert f"1 saga(s) halted in {OPERATOR_NAMESPACE}, waiting on revoke" in summaries  # the renamed scrape's


async def test_a_saga_halted_on_an_entry_it_does_not_own_fires_undo_log_saga_halted(
    cluster: Cluster, kube: Kube, namespace: str, participant: Participant, prometheus: str
) -> None:
    """An abort that could not undo an entry its saga does not own is a halt a person is paged
    for, never a green Compensated."""
    await owner_policy_off(cluster, kube, namespace)
    await register(kube, namespace, participant, "undo")
    created = await kube.create("sagas", namespace, saga("agent"))
    await kube.create("undoentries", namespace, undo_entry("agent", 1, compensation=call("undo")))
    await abort(kube, namespace, "agent")
    halted = await saga_phase(kube, namespace, "agent", "Halted")
    assert (halted["status"]["reason"], created["metadata"]["uid"] in halted["status"]["message"]) == (
        "UnownedEntries",
        True,
    )
    firing = await eventually(
        lambda: alerts(prometheus),
        lambda found: any(
            a["labels"]["alertname"] == "UndoLogSagaHalted" and a["labels"]["namespace"] == namespace for a in found
        ),
        30,
        "UndoLogSagaHalted firing for the saga's namespace",
    )
    summaries = {a["annotations"]["summary"] for a in firing if a["labels"]["alertname"] == "UndoLogSagaHalted"}
    print(f"\nfiring: {summaries}")
    assert any(s.startswith(f"1 saga(s) halted in {namespace}") for s in summaries)
