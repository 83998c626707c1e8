"""The `undolog operator` process: wires the ledger, the calls, an engine and a Lease per shard,
and runs until told to stop (each shard's engine watches its own Sagas and UndoEntries; kopf
runs the process's frame; with several shards, objects that arrive without a bucket label are
watched and filed into their bucket)."""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import contextlib
import dataclasses
import functools
import gc
import logging
import os
import signal
import socket
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from undolog import metrics, tracing
from undolog.api.events import SUCCESSES
from undolog.archive import ArchiveStore
from undolog.calls.http import HttpTransport
from undolog.calls.pace import Pacing, Rate
from undolog.calls.registry import Registry
from undolog.calls.runner import Runner, TaskFence
from undolog.calls.transport import HTTP, MCP, Transport, Transports
from undolog.calls.webhook_cache import WebhookCache
from undolog.controller.archiving import Archiver
from undolog.controller.compensation import Compensator
from undolog.controller.context import SagaSlots, without_slot
from undolog.controller.engine import Engine, ShardParts, shard_engine
from undolog.controller.forward import Forwarder
from undolog.controller.gauges import SagaGauges
from undolog.controller.leadership import Leadership, LeaseSettings, identity
from undolog.controller.object_undo import ObjectUndoer
from undolog.controller.participants import BreakerReport
from undolog.controller.recorded_call import CallRecorder
from undolog.controller.replicas import Replicas
from undolog.controller.retention import Retention
from undolog.controller.shard_labels import ShardLabels, unfiled_watches
from undolog.controller.storage_migration import StorageMigration
from undolog.controller.timeline import Timeline
from undolog.decisions.egress import EgressPolicy
from undolog.decisions.retention import RetentionPolicy
from undolog.decisions.sharding import all_shards
from undolog.kube import Kube
from undolog.kube.kopf_runtime import run_kopf
from undolog.kube.metrics_endpoint import serve_metrics
from undolog.kube.objects import ObjectReads
from undolog.ledger import Ledger

log = logging.getLogger("undolog.operator")
# Each TLS connection asyncio makes holds a read buffer of SSLProtocol.max_size, zero-filled when
# the connection is made: at the default 256 KiB the pool's ~100 connections to the apiserver
# were 26 MiB of the operator's memory. 64 KiB reads a listing page in a few more reads.
TLS_READ_BUFFER = 64 * 1024


@dataclass(frozen=True)
class OperatorOptions:
    lease: LeaseSettings
    identity: str | None = None  # on the Lease; unique among live operators (default: see leadership)
    shards: int = 1  # a Lease per shard; each replica holds its fair share
    namespaces: list[str] = field(default_factory=list)  # empty: all namespaces
    liveness_port: int | None = 8080
    metrics_port: int | None = 9090
    kubeconfig: str | None = None
    max_concurrent_sagas: int = 200
    egress_allow: tuple[str, ...] = ()
    egress_deny: tuple[str, ...] = ()
    egress_allow_loopback: bool = False
    cross_namespace_services: bool = False
    success_events: bool = False  # Normal Events for successful calls and endings too (else only in status)
    retention: RetentionPolicy = field(default_factory=RetentionPolicy)  # defaults for finished sagas
    retention_rate: float = 50.0  # finished sagas deleted per second at most
    archive_dsn: str | None = None  # PostgreSQL (libpq's connection string; PG* variables fill in the rest)
    archive_ttl: timedelta | None = None  # archived sagas older than this are removed from the archive

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


@dataclass
class Calls:
    """What makes and records participant calls: shared by every shard's engine."""

    recorder: CallRecorder
    runner: Runner
    webhooks: WebhookCache
    objects: ObjectUndoer  # Kubernetes objects, undone natively as the user each entry names
    reads: ObjectReads  # and read before and after orchestrated steps change them


def mcp_transport(http: HttpTransport) -> Transport:
    """MCP tools as participants, their requests over the HTTP transport's session. Imported
    here: the `mcp` package (and the OpenTelemetry API it imports) loads with the first MCP call."""
    from undolog.calls.mcp import McpTransport

    return McpTransport(http)


async def calls_of(kube: Kube, ledger: Ledger, timeline: Timeline, options: OperatorOptions) -> Calls:
    fence = TaskFence()  # each driver's task carries its shard's Lease
    http = HttpTransport(options.egress(), guard=fence.check)
    transport = Transports({HTTP: lambda: http, MCP: lambda: mcp_transport(http)})
    webhooks = WebhookCache(kube, options.namespaces)
    pacing = Pacing(without_slot, on_change=BreakerReport(ledger, timeline, webhooks).changed)
    runner = Runner(transport, fence, away=without_slot, pacing=pacing)
    await webhooks.start()
    registry = Registry(ledger, options.cross_namespace_services, webhooks)
    reads = ObjectReads(kube)
    objects = ObjectUndoer(ledger, timeline, fence, reads.impersonation)
    return Calls(CallRecorder(ledger, registry, runner, timeline), runner, webhooks, objects, reads)


@dataclass
class Operator:
    """The process's parts, wired once: an engine and a Lease per shard, and what they share."""

    options: OperatorOptions
    kube: Kube
    ledger: Ledger
    timeline: Timeline
    calls: Calls
    archiver: Archiver | None
    labels: ShardLabels
    leases: Kube = field(init=False)
    leaderships: list[Leadership] = field(init=False)
    replicas: Replicas = field(init=False)
    engines: list[Engine] = field(init=False)
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)  # as long as the process
    stopped: bool = False

    def __post_init__(self) -> None:
        options, me = self.options, self.options.identity or identity()
        shards = all_shards(options.shards)
        self.leases = self.kube.apart()
        self.leaderships = [Leadership(self.leases, options.lease.of_shard(shard), me) for shard in shards]
        self.replicas = Replicas(self.leases, options.lease, me, self.leaderships)
        # Participants' limits divided among replicas by the shards each holds.
        self.calls.runner.pacing.share = lambda: (len(self.replicas.held()), len(shards))
        slots, gauges = SagaSlots(options.max_concurrent_sagas), SagaGauges()
        metrics.series.busy = gauges.busy  # a namespace's series stay while this replica drives a saga there
        policy = dataclasses.replace(options.retention, shards=len(shards))
        pace = Rate(options.retention_rate)
        self.engines = [
            shard_engine(
                ShardParts(
                    self.kube,
                    self.ledger,
                    Compensator(self.calls.recorder, self.calls.objects),
                    Forwarder(self.calls.recorder, self.calls.reads),
                    self.timeline,
                    leadership,
                    namespaces=options.namespaces,
                    shard=shard,
                    slots=slots,
                    gauges=gauges,
                    labels=self.labels,
                    retention=Retention(self.ledger, policy, leadership, pace, self.archiver),
                    archiver=self.archiver,
                    storage=StorageMigration(
                        self.kube,
                        self.ledger,
                        self.leases,
                        leadership.settings,
                        leadership,
                        pace,
                        me,
                        options.namespaces,
                    ),
                )
            )
            for shard, leadership in zip(shards, self.leaderships, strict=True)
        ]

    async def start(self) -> None:
        """Stand for the shards' Leases (a little apart) and, with several shards, file what
        arrives without a bucket label; a task that ends on its own ends the process."""
        if self.archiver is not None:
            self.archiver.start()
        await self.replicas.refresh()  # know how many replicas share the shards before standing for any
        period = self.options.lease.retry_period / len(self.engines)
        self.tasks = [asyncio.create_task(self.replicas.run(), name="replicas")]
        for index, (engine, leadership) in enumerate(zip(self.engines, self.leaderships, strict=True)):
            election = functools.partial(
                leadership.run,
                engine.lead,
                engine.follow,
                may_take=self.replicas.may_take,
                hand_back=self.replicas.hand_back(index),
            )
            self.tasks.append(
                asyncio.create_task(staggered(index * period, election), name=f"Lease of shard {engine.informer.shard}")
            )
        # With one shard its engine watches every object, labelled or not: nothing to file.
        unfiled = unfiled_watches(self.kube, self.labels, self.options.namespaces) if len(self.engines) > 1 else []
        self.tasks += [
            asyncio.create_task(w.run(), name=f"unfiled {w.plural} of {w.namespace or 'all'}") for w in unfiled
        ]
        for task in self.tasks:
            task.add_done_callback(ends_the_process)

    async def stop(self) -> None:
        """Everything UndoLog runs stopped, its Leases handed back. kopf calls it as its cleanup:
        kopf waits 5 s for any task started after it as "hung" before it exits, and every
        engine, watch and driver was."""
        if self.stopped:
            return
        self.stopped = True
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for engine in self.engines:
            await engine.stop()
        await self.labels.stop()
        await self.calls.webhooks.stop()
        for leadership in self.leaderships:
            await leadership.release()
        await self.replicas.leave()
        await self.timeline.stop()
        if self.archiver is not None:
            await self.archiver.stop()

    async def close(self) -> None:
        await self.calls.runner.close()
        await self.kube.close()
        await self.leases.close()

    @property
    def ended_on_its_own(self) -> bool:
        return any(task.done() and not task.cancelled() for task in self.tasks)


async def wired(options: OperatorOptions) -> Operator:
    kube = await Kube.connect(options.kubeconfig)
    ledger = Ledger(kube)
    archiver = None
    if options.archive_dsn is not None:
        archiver = Archiver(ArchiveStore(options.archive_dsn), ledger, options.archive_ttl)
    timeline = Timeline(
        kube,
        quiet=frozenset() if options.success_events else SUCCESSES,
        capture=archiver.events if archiver is not None else None,
    )
    timeline.start()
    calls = await calls_of(kube, ledger, timeline, options)
    return Operator(options, kube, ledger, timeline, calls, archiver, ShardLabels(ledger))


async def run(options: OperatorOptions) -> None:
    asyncio.sslproto.SSLProtocol.max_size = TLS_READ_BUFFER  # this process's own connections only
    if tracing.configure("undolog-operator"):
        log.info("tracing: spans exported over OTLP (OTEL_EXPORTER_OTLP_* variables)")
    operator = await wired(options)
    await operator.start()
    scraped = await serve_metrics(options.metrics_port) if options.metrics_port else None
    # What was made to start (modules, schemas, clients) lives as long as the process: out of the
    # collector's sight, a full collection of an idle operator takes ~0 ms instead of ~50 ms, which
    # landed on whatever abort was being handled.
    gc.collect()
    gc.freeze()
    log.info(
        "watching %s; %s shard(s), Lease %s",
        ", ".join(options.namespaces) or "all namespaces",
        len(operator.engines),
        ", ".join(leadership.reference for leadership in operator.leaderships),
    )
    try:
        await run_kopf(operator.kube, options.namespaces, options.liveness_port, operator.stop)
    finally:
        await operator.stop()  # when kopf ended before its cleanup
        await operator.close()
        if scraped is not None:
            await scraped.cleanup()
        tracing.shutdown()
    if operator.ended_on_its_own:
        raise SystemExit(1)  # one ended on its own (ends_the_process): not a clean stop


def terminate() -> None:
    signal.raise_signal(signal.SIGTERM)  # kopf stops as for `kubectl delete pod`: Leases handed back


def ends_the_process(task: asyncio.Task[Any], stop: Callable[[], None] = terminate) -> None:
    """A task that runs as long as the process (a Lease's election, the replicas' membership, a
    watch) ended on its own, with an unforeseen error: the process stops, with the error in
    its log, exits 1 and is started again (by the kubelet), instead of running on without that
    part: a shard's sagas driven by no one, and nothing said."""
    if task.cancelled():
        return
    log.critical("%s ended (%r): the operator stops, to be started again", task.get_name(), task.exception())
    stop()


async def staggered(delay: float, election: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """The shards' elections a little apart, so that a replica counts the shards it took before
    standing for the next one."""
    await asyncio.sleep(delay)
    await election()


def main(options: OperatorOptions) -> None:
    asyncio.run(run(options))
