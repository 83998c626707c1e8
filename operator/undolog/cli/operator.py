"""`undolog operator`: run the operator in the foreground. The operator's modules (kopf,
the HTTP transport) are imported only when it runs: `undolog[cli]` works without them."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated

import typer

from undolog.decisions.egress import rule
from undolog.inspect import duration
from undolog.kube import default_namespace


class LogFormat(StrEnum):
    plain = "plain"
    full = "full"
    json = "json"


def _cidr(value: str) -> str:
    try:
        rule(value)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    return value


def _duration(value: str | None) -> str | None:
    if value is None:
        return None
    try:
        duration(value)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    return value


def _lease_name(value: str) -> str:
    # It names Leases (<name>-shard-<i>, <name>-replica-<k>) and is the label value that finds
    # the replicas' ones: a longer name made every count of the replicas fail.
    if len(value) > 63 or not re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", value):
        raise typer.BadParameter(
            f"{value!r}: at most 63 lower-case letters, digits, '-' and '.', beginning and ending with a letter "
            "or digit (it names the Leases, and labels the replicas' ones)"
        )
    return value


def operator(
    namespace: Annotated[
        list[str] | None,
        typer.Option("--namespace", "-n", help="Watch only this namespace (repeatable); all namespaces by default."),
    ] = None,
    log_format: Annotated[LogFormat, typer.Option(help="Log line format.")] = LogFormat.plain,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging.")] = False,
    liveness_port: Annotated[int, typer.Option(help="Port of /healthz (0 disables it).")] = 8080,
    metrics_port: Annotated[int, typer.Option(help="Port of /metrics (0 disables it).")] = 9090,
    kubeconfig: Annotated[
        str | None,
        typer.Option(help="Kubeconfig file (default: KUBECONFIG's files, merged; in a Pod, its service account)."),
    ] = None,
    leader_election_namespace: Annotated[
        str | None,
        typer.Option(envvar="POD_NAMESPACE", help="Namespace of the Lease (default: the kubeconfig's namespace)."),
    ] = None,
    lease_name: Annotated[
        str,
        typer.Option(
            callback=_lease_name,
            help="The Lease every operator of one installation stands for: one of them drives sagas.",
        ),
    ] = "undolog-operator",
    identity: Annotated[
        str | None,
        typer.Option(
            envvar="POD_NAME",
            help="This operator's name on the Lease; unique among live operators (in a pod: the pod's name).",
        ),
    ] = None,
    lease_seconds: Annotated[
        int, typer.Option(min=3, help="Lease duration: how long a standby waits for a dead leader.")
    ] = 15,
    shards: Annotated[
        int,
        typer.Option(
            min=1,
            max=64,
            envvar="UNDOLOG_SHARDS",
            help="Shards the sagas are spread over, each driven by one replica at a time (a Lease per shard); "
            "at least the number of replicas to share the work. Every replica of one installation uses the same.",
        ),
    ] = 1,
    max_concurrent_sagas: Annotated[
        int, typer.Option(min=1, help="Sagas worked on at once (memory and fairness); the rest queue.")
    ] = 200,
    egress_allow: Annotated[
        list[str] | None,
        typer.Option(
            callback=lambda values: [_cidr(v) for v in values or []],
            help="CIDR[:PORT,...] the operator may call (repeatable); everywhere by default.",
        ),
    ] = None,
    egress_deny: Annotated[
        list[str] | None,
        typer.Option(
            callback=lambda values: [_cidr(v) for v in values or []],
            help="CIDR[:PORT,...] it never calls, beyond loopback, link-local, multicast and its own ports.",
        ),
    ] = None,
    egress_allow_loopback: Annotated[
        bool, typer.Option(help="Let Webhooks call loopback addresses (tests, a sidecar); its own ports stay refused.")
    ] = False,
    allow_cross_namespace_services: Annotated[
        bool, typer.Option(help="Let a Webhook's service target name a Service of another namespace.")
    ] = False,
    ttl_after_completed: Annotated[
        str | None,
        typer.Option(
            callback=lambda value: _duration(value),
            help="Delete a Completed saga (and its entries) this long after it completed (24h, 7d, ...), unless "
            "its spec.ttlSecondsAfterFinished says otherwise; kept by default.",
        ),
    ] = None,
    ttl_after_compensated: Annotated[
        str | None,
        typer.Option(
            callback=lambda value: _duration(value),
            help="The same for a Compensated saga. A Halted saga is never deleted; once resolved, its clock starts.",
        ),
    ] = None,
    max_finished_per_namespace: Annotated[
        int | None,
        typer.Option(min=1, help="Finished sagas kept per namespace; the oldest go first past it. No cap by default."),
    ] = None,
    retention_rate: Annotated[
        float,
        typer.Option(min=0.1, help="Finished sagas deleted per second at most, beside the compensation work."),
    ] = 50.0,
    archive_dsn: Annotated[
        str | None,
        typer.Option(
            envvar="UNDOLOG_ARCHIVE_DSN",
            help="Archive every finished saga in this PostgreSQL database (a libpq connection string; the PG* "
            "variables, such as PGPASSWORD, fill in what it leaves out). Retention then deletes only what it holds.",
        ),
    ] = None,
    archive_ttl: Annotated[
        str | None,
        typer.Option(
            callback=lambda value: _duration(value), help="Remove archived sagas this old (90d); kept by default."
        ),
    ] = None,
    success_events: Annotated[
        bool,
        typer.Option(
            "--success-events/--no-success-events",
            "--call-events/--no-call-events",  # its name before it covered a saga's successful end
            help="Also post Normal Events for each successful call and for a saga Completed or Compensated "
            "(the status records them with their time either way; every Warning and every other phase "
            "change is always an Event).",
        ),
    ] = False,
) -> None:
    """Run the UndoLog operator: drive sagas through their phases and compensate them LIFO.

    Every operator stands for a Lease (--lease-name in the Lease namespace), one per shard with
    --shards; only its holder drives that shard's sagas, so a second operator started by mistake
    waits (or shares the shards) instead of sending everything twice."""
    from undolog.controller.leadership import LeaseSettings
    from undolog.controller.main import OperatorOptions, main
    from undolog.decisions.retention import RetentionPolicy
    from undolog.kube.kopf_runtime import configure_logging

    configure_logging(log_format.value, verbose)
    main(
        OperatorOptions(
            lease=LeaseSettings(
                leader_election_namespace or default_namespace(kubeconfig), name=lease_name, lease_seconds=lease_seconds
            ),
            identity=identity,
            shards=shards,
            namespaces=namespace or [],
            liveness_port=liveness_port or None,
            metrics_port=metrics_port or None,
            kubeconfig=kubeconfig,
            max_concurrent_sagas=max_concurrent_sagas,
            egress_allow=tuple(egress_allow or ()),
            egress_deny=tuple(egress_deny or ()),
            egress_allow_loopback=egress_allow_loopback,
            cross_namespace_services=allow_cross_namespace_services,
            success_events=success_events,
            retention=RetentionPolicy(
                completed=duration(ttl_after_completed) if ttl_after_completed else None,
                compensated=duration(ttl_after_compensated) if ttl_after_compensated else None,
                max_finished=max_finished_per_namespace,
            ),
            retention_rate=retention_rate,
            archive_dsn=archive_dsn,
            archive_ttl=duration(archive_ttl) if archive_ttl else None,
        )
    )
