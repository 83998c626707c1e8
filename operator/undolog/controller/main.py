"""The `undolog operator` process: kopf watches Sagas and feeds the engine (UndoEntries are
watched by the engine itself, in order: controller.entry_watch).

Only kopf's event handlers are used: they write nothing to the objects (no progress or
diff-base annotations, no kopf finalizer), so the CRDs' status holds UndoLog's fields alone.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

import kopf
from prometheus_client import start_http_server

from undolog.api.common import GROUP, VERSION
from undolog.calls.runner import Runner
from undolog.controller.compensation import Compensator
from undolog.controller.engine import Engine
from undolog.controller.forward import Forwarder
from undolog.controller.leadership import LeaseSettings, campaign
from undolog.controller.ledger import Ledger
from undolog.controller.recorded_call import CallRecorder
from undolog.controller.timeline import Timeline
from undolog.kube import Kube

log = logging.getLogger("undolog.operator")


@dataclass(frozen=True)
class OperatorOptions:
    namespaces: list[str] = field(default_factory=list)  # empty: all namespaces
    liveness_port: int | None = 8080
    metrics_port: int | None = 9090
    kubeconfig: str | None = None
    lease: LeaseSettings | None = None  # None: no leader election (a single operator)
    max_concurrent_sagas: int = 200


def connection_info(kube: Kube) -> kopf.ConnectionInfo:
    """kopf logs in with exactly the credentials our own client loaded (kubeconfig or in-cluster)."""
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


def build_registry(engine: Engine, kube: Kube) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()

    @kopf.on.startup(registry=registry)
    async def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.posting.enabled = False  # UndoLog posts its own Events (controller.timeline)
        settings.watching.server_timeout = 300  # reconnect streams that go quiet (kopf #1276)
        settings.watching.client_timeout = 330
        settings.watching.connect_timeout = 10
        settings.queueing.batch_window = 0.01  # event handlers: react within milliseconds
        settings.networking.request_timeout = 60
        settings.persistence.diffbase_storage = NoDiffBase()

    @kopf.on.login(registry=registry)
    async def login(**_: Any) -> kopf.ConnectionInfo:
        return connection_info(kube)

    @kopf.on.event(GROUP, VERSION, "sagas", registry=registry)
    async def saga_changed(event: kopf.RawEvent, **_: Any) -> None:
        engine.saga_event(event.get("type"), dict(event["object"]))

    return registry


async def run(options: OperatorOptions) -> None:
    # The generated client logs whole response bodies at DEBUG, Secrets included: never.
    logging.getLogger("kubernetes_asyncio").setLevel(logging.WARNING)
    logging.getLogger("kubernetes_asyncio.leaderelection").setLevel(logging.INFO)
    kube = await Kube.connect(options.kubeconfig)
    runner = Runner()
    ledger = Ledger(kube)
    timeline = Timeline(kube)
    timeline.start()
    recorder = CallRecorder(ledger, runner, timeline)
    engine = Engine(
        ledger,
        Compensator(recorder),
        Forwarder(recorder),
        timeline,
        namespaces=options.namespaces,
        max_concurrent=options.max_concurrent_sagas,
    )
    if options.lease is None:
        await engine.lead()  # a single operator leads from the start
    elections = (
        asyncio.create_task(campaign(kube, options.lease, engine.lead, engine.follow), name="leader election")
        if options.lease
        else None
    )
    if options.metrics_port:
        start_http_server(options.metrics_port)
    liveness = f"http://0.0.0.0:{options.liveness_port}/healthz" if options.liveness_port else None
    log.info("watching %s", ", ".join(options.namespaces) or "all namespaces")
    try:
        await kopf.operator(
            registry=build_registry(engine, kube),
            clusterwide=not options.namespaces,
            namespaces=options.namespaces,
            liveness_endpoint=liveness,
            standalone=True,
        )
    finally:
        if elections is not None:
            elections.cancel()
        await engine.stop()
        await timeline.stop()
        await runner.close()
        await kube.close()


def main(options: OperatorOptions) -> None:
    asyncio.run(run(options))
