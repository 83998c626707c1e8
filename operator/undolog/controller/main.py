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

from prometheus_client import start_http_server

from undolog import metrics
from undolog.api.events import SUCCESSES
from undolog.archive import ArchiveStore
from undolog.calls.http import HttpTransport
from undolog.calls.registry import Registry
from undolog.calls.runner import Runner, TaskFence
from undolog.calls.webhook_cache import WebhookCache
from undolog.controller.archiving import Archiver
from undolog.controller.compensation import Compensator
from undolog.controller.context import SagaSlots, wait_without_slot
from undolog.controller.engine import Engine
from undolog.controller.forward import Forwarder
from undolog.controller.gauges import SagaGauges
from undolog.controller.leadership import Leadership, LeaseSettings, identity
from undolog.controller.recorded_call import CallRecorder
from undolog.controller.replicas import Replicas
from undolog.controller.retention import Pace, Retention
from undolog.controller.shard_labels import ShardLabels, unfiled_watches
from undolog.controller.storage_migration import StorageMigration
from undolog.controller.timeline import Timeline
from undolog.decisions.egress import EgressPolicy
from undolog.decisions.retention import RetentionPolicy
from undolog.decisions.sharding import all_shards
from undolog.kube import Kube
from undolog.kube.kopf_runtime import run_kopf
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


async def run(options: OperatorOptions) -> None:
    asyncio.sslproto.SSLProtocol.max_size = TLS_READ_BUFFER  # this process's own connections only
    kube = await Kube.connect(options.kubeconfig)
    ledger = Ledger(kube)
    archiver = (
        Archiver(ArchiveStore(options.archive_dsn), ledger, options.archive_ttl)
        if options.archive_dsn is not None
        else None
    )
    timeline = Timeline(
        kube,
        quiet=frozenset() if options.success_events else SUCCESSES,
        capture=archiver.events if archiver is not None else None,
    )
    timeline.start()
    me = options.identity or identity()
    fence = TaskFence()  # each driver's task carries its shard's Lease
    transport = HttpTransport(options.egress(), guard=fence.check)
    runner = Runner(transport, fence, sleep=wait_without_slot)
    webhooks = WebhookCache(kube, options.namespaces)
    await webhooks.start()
    recorder = CallRecorder(ledger, Registry(ledger, options.cross_namespace_services, webhooks), runner, timeline)
    labels = ShardLabels(ledger)
    slots, gauges = SagaSlots(options.max_concurrent_sagas), SagaGauges()
    metrics.series.busy = gauges.busy  # a namespace's series stay while this replica drives a saga there
    shards = all_shards(options.shards)
    policy = dataclasses.replace(options.retention, shards=len(shards))
    pace = Pace(options.retention_rate)
    leases = kube.apart()
    leaderships = [Leadership(leases, options.lease.of_shard(shard), me) for shard in shards]
    replicas = Replicas(leases, options.lease, me, leaderships)
    engines = [
        Engine(
            kube,
            ledger,
            Compensator(recorder),
            Forwarder(recorder),
            timeline,
            leadership,
            namespaces=options.namespaces,
            shard=shard,
            slots=slots,
            gauges=gauges,
            labels=labels,
            retention=Retention(ledger, policy, leadership, pace, archiver),
            archiver=archiver,
            storage=StorageMigration(kube, ledger, leases, leadership.settings, leadership, pace, me),
        )
        for shard, leadership in zip(shards, leaderships, strict=True)
    ]
    if archiver is not None:
        archiver.committed.extend(engine.retention.archived for engine in engines if engine.retention)
        archiver.start()
    await replicas.refresh()  # know how many replicas share the shards before standing for any
    elections = [asyncio.create_task(replicas.run(), name="replicas")] + [
        asyncio.create_task(
            staggered(
                index * options.lease.retry_period / len(shards),
                functools.partial(
                    leadership.run,
                    engine.lead,
                    engine.follow,
                    may_take=replicas.may_take,
                    hand_back=replicas.hand_back(index),
                ),
            ),
            name=f"Lease of shard {engine.shard}",
        )
        for index, (engine, leadership) in enumerate(zip(engines, leaderships, strict=True))
    ]
    if options.metrics_port:
        start_http_server(options.metrics_port)
    # What was made to start (modules, schemas, clients) lives as long as the process: out of the
    # collector's sight, a full collection of an idle operator takes ~0 ms instead of ~50 ms, which
    # landed on whatever abort was being handled.
    gc.collect()
    gc.freeze()
    log.info(
        "watching %s; %s shard(s), Lease %s",
        ", ".join(options.namespaces) or "all namespaces",
        len(shards),
        ", ".join(leadership.reference for leadership in leaderships),
    )

    # With one shard its engine watches every object, labelled or not: nothing to file.
    filing = [
        asyncio.create_task(watch.run(), name=f"unfiled {watch.plural} of {watch.namespace or 'all'}")
        for watch in (unfiled_watches(kube, labels, options.namespaces) if len(shards) > 1 else [])
    ]
    for task in elections + filing:
        task.add_done_callback(ends_the_process)
    stopped = False

    async def stop_own_work() -> None:
        """Everything UndoLog runs stopped, its Leases handed back. kopf calls it as its cleanup:
        kopf waits 5 s for any task started after it as "hung" before it exits, and every
        engine, watch and driver was."""
        nonlocal stopped
        if stopped:
            return
        stopped = True
        for task in elections + filing:
            task.cancel()
        await asyncio.gather(*elections, *filing, return_exceptions=True)
        for engine in engines:
            await engine.stop()
        await labels.stop()
        await webhooks.stop()
        for leadership in leaderships:
            await leadership.release()
        await replicas.leave()
        await timeline.stop()
        if archiver is not None:
            await archiver.stop()

    try:
        await run_kopf(kube, options.namespaces, options.liveness_port, stop_own_work)
    finally:
        await stop_own_work()  # when kopf ended before its cleanup
        await runner.close()
        await kube.close()
        await leases.close()
    if any(task.done() and not task.cancelled() for task in elections + filing):
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
