"""`undolog operator`: run the operator in the foreground."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import kopf
import typer

from undolog.controller.leadership import LeaseSettings
from undolog.controller.main import OperatorOptions, main
from undolog.kube import default_namespace


class LogFormat(StrEnum):
    plain = "plain"
    full = "full"
    json = "json"


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
        str | None, typer.Option(envvar="KUBECONFIG", help="Kubeconfig file; in-cluster config when unset.")
    ] = None,
    leader_election: Annotated[
        bool, typer.Option(help="Hold a Lease: with several replicas, only the holder drives sagas.")
    ] = False,
    leader_election_namespace: Annotated[
        str | None,
        typer.Option(envvar="POD_NAMESPACE", help="Namespace of the Lease (default: the kubeconfig's namespace)."),
    ] = None,
    max_concurrent_sagas: Annotated[
        int, typer.Option(min=1, help="Sagas worked on at once (memory and fairness); the rest queue.")
    ] = 200,
    lease_seconds: Annotated[
        int, typer.Option(min=3, help="Lease duration: how long a standby waits for a dead leader.")
    ] = 15,
) -> None:
    """Run the UndoLog operator: drive sagas through their phases and compensate them LIFO."""
    formats = {"plain": kopf.LogFormat.PLAIN, "full": kopf.LogFormat.FULL, "json": kopf.LogFormat.JSON}
    kopf.configure(verbose=verbose, log_format=formats[log_format.value])
    main(
        OperatorOptions(
            namespaces=namespace or [],
            liveness_port=liveness_port or None,
            metrics_port=metrics_port or None,
            kubeconfig=kubeconfig,
            lease=LeaseSettings(leader_election_namespace or default_namespace(kubeconfig), lease_seconds=lease_seconds)
            if leader_election
            else None,
            max_concurrent_sagas=max_concurrent_sagas,
        )
    )
