"""`make traces`: the trace of an SDK saga that aborted, read back from a real trace backend
(Jaeger v2, built from the Go module proxy by `make bin/jaeger`): the agent's span, the SDK's
entry writes under it, and the operator's compensation attempts and saga span in the same
trace, joined through the saga's `undolog.io/traceparent` annotation; the participant receives
the attempt's `traceparent`."""

from __future__ import annotations

import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from devtools.control_plane.local import free_port
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from tests.conftest import BIN, Cluster
from tests.support.manifests import webhook
from tests.support.operator_process import OperatorProcess
from tests.support.participants import Participant
from tests.support.waiting import eventually, saga_phase, serving
from undolog.kube import Kube
from undolog.sdk import Call, SagaRun, open_saga

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def jaeger(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """Jaeger all-in-one with in-memory storage on loopback: (OTLP/HTTP endpoint, query URL)."""
    otlp, query, grpc = free_port(), free_port(), free_port()
    config = tmp_path_factory.mktemp("jaeger") / "config.yaml"
    config.write_text(
        textwrap.dedent(f"""
            service:
              extensions: [jaeger_storage, jaeger_query]
              pipelines:
                traces: {{receivers: [otlp], exporters: [jaeger_storage_exporter]}}
              telemetry: {{metrics: {{level: none}}}}
            receivers:
              otlp:
                protocols:
                  http: {{endpoint: "127.0.0.1:{otlp}"}}
                  grpc: {{endpoint: "127.0.0.1:{grpc}"}}
            exporters:
              jaeger_storage_exporter: {{trace_storage: memory}}
            extensions:
              jaeger_storage:
                backends:
                  memory: {{memory: {{max_traces: 10000}}}}
              jaeger_query:
                storage: {{traces: memory}}
                http: {{endpoint: "127.0.0.1:{query}"}}
                grpc: {{endpoint: "127.0.0.1:{free_port()}"}}
        """)
    )
    log = config.with_suffix(".log").open("wb")
    process = subprocess.Popen([str(BIN / "jaeger"), "--config", str(config)], stdout=log, stderr=subprocess.STDOUT)
    query_url = f"http://127.0.0.1:{query}"
    serving(f"{query_url}/api/services", process, config.with_suffix(".log"), 60)
    try:
        yield f"http://127.0.0.1:{otlp}", query_url
    finally:
        process.terminate()
        process.wait(timeout=15)
        log.close()


def traces_of(query_url: str, service: str) -> list[dict[str, Any]]:
    answer = httpx.get(f"{query_url}/api/traces", params={"service": service, "limit": 20}, timeout=10)
    return list(answer.json().get("data") or [])


async def test_an_aborted_saga_is_one_trace_from_the_agent_to_the_compensation(
    cluster: Cluster, kube: Kube, namespace: str, participant: Participant, jaeger: tuple[str, str], tmp_path: Path
) -> None:
    endpoint, query_url = jaeger
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: "agent"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{endpoint}/v1/traces")))
    tracer = provider.get_tracer("agent")
    trace.set_tracer_provider(provider)
    operator = OperatorProcess(
        cluster.kubeconfig,
        namespace,
        tmp_path,
        environment={"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_BSP_SCHEDULE_DELAY": "200"},
    )
    operator.start()
    try:
        await kube.create("webhooks", namespace, webhook("refund", url=participant.url("/refund")))
        with tracer.start_as_current_span("agent books a trip") as agent:
            saga = await open_saga(namespace=namespace, name="trip", kubeconfig=str(cluster.kubeconfig))
            with pytest.raises(RuntimeError):
                await book(saga)
        await saga_phase(kube, namespace, "trip", "Compensated")
    finally:
        operator.stop()  # its spans exported as it stops
    trace_id = format(agent.get_span_context().trace_id, "032x")
    [call] = participant.received("/refund")
    assert call.headers["traceparent"].split("-")[1] == trace_id  # the participant can join it too

    def spans() -> list[str]:
        found = [t for t in traces_of(query_url, "undolog-operator") if t["traceID"] == trace_id]
        return sorted(s["operationName"] for t in found for s in t["spans"])

    names = await eventually(lambda: _async(spans), lambda n: "compensation refund" in n, 30, "the trace in Jaeger")
    assert {"agent books a trip", "undolog register charge", "undolog record charge"} <= set(names)
    assert "compensation refund" in names
    assert f"saga {namespace}/trip" in names
    print(f"\ntrace {trace_id}: {names}")


async def book(saga: SagaRun) -> None:
    """A step, then a failure: the saga aborts."""
    async with saga:
        async with saga.step("charge", Call(function="refund", args={"amount": 5})):
            pass
        raise RuntimeError("the hotel is full")


async def _async(probe: Any) -> Any:
    return probe()
