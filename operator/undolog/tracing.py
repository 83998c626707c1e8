"""OpenTelemetry traces of sagas, forward calls and compensation attempts; off unless asked for.

The operator traces when the standard OTLP endpoint variable is set
(`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT`, and not
`OTEL_SDK_DISABLED=true`); the other `OTEL_*` variables configure the exporter as usual. The SDK
traces only in a process that already uses OpenTelemetry (its own tracer provider), and stores
the agent's trace context on each saga it opens (the `undolog.io/traceparent` annotation): the
operator's spans for that saga, hours later, join the agent's trace. When off, nothing of
OpenTelemetry is imported.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime
from types import ModuleType
from typing import Any

TRACEPARENT_ANNOTATION = "undolog.io/traceparent"
TRACEPARENT_HEADER = "traceparent"
_configured = False


def asked_for() -> bool:
    wanted = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    return bool(wanted) and os.environ.get("OTEL_SDK_DISABLED", "").lower() != "true"


def configure(service: str) -> bool:
    """The operator's tracer provider, exporting over OTLP/HTTP; False when tracing is off."""
    global _configured
    if not asked_for():
        return False
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: os.environ.get("OTEL_SERVICE_NAME", service)}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    _configured = True
    return True


def shutdown() -> None:
    """Export what is left (the operator stopping)."""
    if _configured:
        from opentelemetry import trace

        provider: Any = trace.get_tracer_provider()
        provider.shutdown()


def _api() -> ModuleType | None:
    """opentelemetry.trace when tracing is on here: configured, or already used by the process."""
    if not _configured and "opentelemetry.trace" not in sys.modules:
        return None
    from opentelemetry import trace

    return trace


def _parent(traceparent: str | None) -> Any:
    if not traceparent:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator().extract({TRACEPARENT_HEADER: traceparent})


Note = Callable[[str, str | int], None]  # sets an attribute of the span (nothing when not tracing)


@contextlib.contextmanager
def span(
    name: str, attributes: Mapping[str, str | int], *, parent: str | None = None, start: datetime | None = None
) -> Iterator[Note]:
    """A span around the block, a child of `parent` (a W3C traceparent) or of the current span."""
    api = _api()
    if api is None:
        yield lambda key, value: None
        return
    tracer = api.get_tracer("undolog")
    start_time = int(start.timestamp() * 1e9) if start else None
    with tracer.start_as_current_span(
        name, context=_parent(parent), attributes=dict(attributes), start_time=start_time
    ) as current:
        yield current.set_attribute


def traceparent() -> str | None:
    """The current span's W3C traceparent (None when not tracing)."""
    if _api() is None:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier.get(TRACEPARENT_HEADER)
