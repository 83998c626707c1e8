"""Traces: nothing of OpenTelemetry imported while off; when on, each attempt is a span in the
saga's trace, its context sent to the participant."""

from __future__ import annotations

import subprocess
import sys

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.support.fakes import FakeTransport
from undolog.api import Backoff
from undolog.calls.runner import AttemptRecord, CallTrace, Runner, Unfenced
from undolog.calls.transport import Target

OFF = """
import sys
import undolog.sdk, undolog.controller.main
from undolog import tracing
with tracing.span("s", {"a": 1}) as note:
    note("b", 2)
assert tracing.traceparent() is None
loaded = sorted(m for m in sys.modules if m.startswith("opentelemetry"))
assert not loaded, loaded
"""


def test_while_off_nothing_of_opentelemetry_is_imported() -> None:
    done = subprocess.run([sys.executable, "-c", OFF], capture_output=True, text=True, check=False, env={})
    assert done.returncode == 0, done.stderr


async def test_an_attempt_is_a_span_of_the_sagas_trace_and_the_participant_gets_its_context() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    agent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    transport = FakeTransport()
    runner = Runner(transport, Unfenced())

    async def noted(record: AttemptRecord, delay: float | None) -> None:
        return None

    called = CallTrace("compensation refund", {"undolog.entry": "trip-1"}, parent=agent)
    target = Target(url="http://127.0.0.1:1/refund", timeout_seconds=1, participant="ns/refund")
    await runner.call(target, {}, lambda n: {}, backoff=Backoff(), max_retries=0, on_attempt=noted, trace=called)
    [span] = exporter.get_finished_spans()
    assert span.name == "compensation refund"
    assert format(span.context.trace_id, "032x") == "0af7651916cd43dd8448eb211c80319c"
    assert span.parent is not None
    assert format(span.parent.span_id, "016x") == "b7ad6b7169203331"
    assert dict(span.attributes or {}) == {
        "undolog.entry": "trip-1",
        "undolog.attempt": 1,
        "undolog.outcome": "succeeded",
        "http.response.status_code": 200,
    }
    sent = transport.sent[0].headers["traceparent"]
    assert sent.split("-")[1:3] == ["0af7651916cd43dd8448eb211c80319c", format(span.context.span_id, "016x")]
