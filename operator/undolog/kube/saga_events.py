"""kopf watches Sagas and hands every event to one callback; it runs the liveness endpoint.

Only kopf's event handlers are used: they write nothing to the objects (no progress or
diff-base annotations, no kopf finalizer), so the CRDs' status holds UndoLog's fields alone.
kopf logs in with exactly the credentials of UndoLog's own client, and uses its timeouts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import kopf

from undolog.api import GROUP, VERSION
from undolog.kube.client import Body, Kube


def configure_logging(log_format: str, verbose: bool) -> None:
    """plain, full or json log lines (kopf's formats, which UndoLog's own loggers use too)."""
    formats = {"plain": kopf.LogFormat.PLAIN, "full": kopf.LogFormat.FULL, "json": kopf.LogFormat.JSON}
    kopf.configure(verbose=verbose, log_format=formats[log_format])


def connection_info(kube: Kube) -> kopf.ConnectionInfo:
    configuration = kube.api.configuration
    token = configuration.api_key.get("authorization") or configuration.api_key.get("BearerToken")
    if token and token.lower().startswith("bearer "):
        token = token[7:]
    return kopf.ConnectionInfo(
        server=configuration.host,
        ca_path=configuration.ssl_ca_cert,
        insecure=not configuration.verify_ssl,
        certificate_path=configuration.cert_file,
        private_key_path=configuration.key_file,
        token=token,
    )


class NoDiffBase(kopf.DiffBaseStorage):
    """Event handlers need no diff base; kopf would still deep-copy every body to build one."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        raise AssertionError("UndoLog registers no change handlers, so kopf never stores a diff base")


def registry(kube: Kube, on_saga: Callable[[str | None, Body], None]) -> kopf.OperatorRegistry:
    handlers = kopf.OperatorRegistry()
    timeouts = kube.timeouts

    @kopf.on.startup(registry=handlers)
    async def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.posting.enabled = False  # UndoLog posts its own Events (controller.timeline)
        settings.watching.server_timeout = timeouts.watch  # reconnect streams that go quiet (kopf #1276)
        settings.watching.client_timeout = timeouts.watch_client
        settings.watching.connect_timeout = timeouts.connect
        settings.networking.request_timeout = timeouts.request
        settings.persistence.diffbase_storage = NoDiffBase()

    @kopf.on.login(registry=handlers)
    async def login(**_: Any) -> kopf.ConnectionInfo:
        return connection_info(kube)

    @kopf.on.event(GROUP, VERSION, "sagas", registry=handlers)
    async def saga_changed(event: kopf.RawEvent, **_: Any) -> None:
        on_saga(event.get("type"), dict(event["object"]))

    return handlers


async def watch_sagas(
    kube: Kube, namespaces: list[str], liveness_port: int | None, on_saga: Callable[[str | None, Body], None]
) -> None:
    """Run until the process is told to stop (SIGTERM, SIGINT)."""
    await kopf.operator(
        registry=registry(kube, on_saga),
        clusterwide=not namespaces,
        namespaces=namespaces,
        liveness_endpoint=f"http://0.0.0.0:{liveness_port}/healthz" if liveness_port else None,
        standalone=True,
    )
