"""The `undolog operator` process: wires the ledger, the calls, the engine and the Lease, and
runs until told to stop (kopf watches Sagas; UndoEntries are watched by the engine itself)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from dataclasses import dataclass, field

from prometheus_client import start_http_server

from undolog.api.events import CALL_SUCCESSES
from undolog.calls.http import HttpTransport
from undolog.calls.registry import Registry
from undolog.calls.runner import Runner
from undolog.calls.webhook_cache import WebhookCache
from undolog.controller.compensation import Compensator
from undolog.controller.context import wait_without_slot
from undolog.controller.engine import Engine
from undolog.controller.forward import Forwarder
from undolog.controller.leadership import Leadership, LeaseSettings
from undolog.controller.recorded_call import CallRecorder
from undolog.controller.timeline import Timeline
from undolog.decisions.egress import EgressPolicy
from undolog.kube import Kube
from undolog.kube.saga_events import watch_sagas
from undolog.ledger import Ledger

log = logging.getLogger("undolog.operator")


@dataclass(frozen=True)
class OperatorOptions:
    lease: LeaseSettings
    identity: str | None = None  # on the Lease; unique among live operators (default: see leadership)
    namespaces: list[str] = field(default_factory=list)  # empty: all namespaces
    liveness_port: int | None = 8080
    metrics_port: int | None = 9090
    kubeconfig: str | None = None
    max_concurrent_sagas: int = 200
    egress_allow: tuple[str, ...] = ()
    egress_deny: tuple[str, ...] = ()
    egress_allow_loopback: bool = False
    cross_namespace_services: bool = False
    call_events: bool = False  # a Normal Event per successful call too (else only in status)

    def egress(self) -> EgressPolicy:
        return EgressPolicy.build(
            allow=self.egress_allow,
            deny=self.egress_deny,
            allow_loopback=self.egress_allow_loopback,
            own_addresses=own_addresses(),
            own_ports=(self.liveness_port or 0, self.metrics_port or 0),
        )


def own_addresses() -> set[str]:
    """This process's addresses (the pod's), whose ports the operator never calls."""
    found = {os.environ["POD_IP"]} if os.environ.get("POD_IP") else set()
    with contextlib.suppress(OSError):
        found.update(str(info[4][0]) for info in socket.getaddrinfo(socket.gethostname(), None))
    return {address.split("%", 1)[0] for address in found}


async def run(options: OperatorOptions) -> None:
    # The generated client logs whole response bodies at DEBUG, Secrets included: never.
    logging.getLogger("kubernetes_asyncio").setLevel(logging.WARNING)
    kube = await Kube.connect(options.kubeconfig)
    ledger = Ledger(kube)
    timeline = Timeline(kube, quiet=frozenset() if options.call_events else CALL_SUCCESSES)
    timeline.start()
    leadership = Leadership(kube, options.lease, options.identity)
    transport = HttpTransport(options.egress(), guard=leadership.check)
    runner = Runner(transport, leadership, sleep=wait_without_slot)
    webhooks = WebhookCache(kube, options.namespaces)
    await webhooks.start()
    recorder = CallRecorder(ledger, Registry(ledger, options.cross_namespace_services, webhooks), runner, timeline)
    engine = Engine(
        kube,
        ledger,
        Compensator(recorder),
        Forwarder(recorder),
        timeline,
        leadership,
        namespaces=options.namespaces,
        max_concurrent=options.max_concurrent_sagas,
    )
    elections = asyncio.create_task(leadership.run(engine.lead, engine.follow), name="leader election")
    if options.metrics_port:
        start_http_server(options.metrics_port)
    log.info("watching %s; Lease %s", ", ".join(options.namespaces) or "all namespaces", leadership.reference)
    try:
        await watch_sagas(kube, options.namespaces, options.liveness_port, engine.saga_event)
    finally:
        elections.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await elections
        await engine.stop()
        await webhooks.stop()
        await leadership.release()
        await timeline.stop()
        await runner.close()
        await kube.close()


def main(options: OperatorOptions) -> None:
    asyncio.run(run(options))
