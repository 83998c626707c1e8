"""`python -m devtools.cluster up|down|reset`: the local control plane used by `make demo`
and the tests (`make cluster-up`, `make cluster-down`, `make cluster-reset`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from devtools.control_plane import ControlPlaneError, LocalControlPlane

app = typer.Typer(help="A local control plane (etcd, kube-apiserver, kube-controller-manager) on loopback.")

StateDir = Annotated[Path, typer.Option("--state-dir", envvar="UNDOLOG_CLUSTER_DIR", help="Where state and logs live.")]
BinDir = Annotated[Path, typer.Option("--bin-dir", envvar="UNDOLOG_BIN_DIR", help="Binaries built by `make tools`.")]


@app.command()
def up(
    state_dir: StateDir = Path(".cluster"),
    bin_dir: BinDir = Path("bin"),
    durable: Annotated[bool, typer.Option(help="fsync etcd writes (slower, survives a machine crash).")] = False,
    node: Annotated[
        bool, typer.Option(help="Also a node (kubelet, containerd, kube-scheduler, kube-proxy) that runs pods; root.")
    ] = False,
    image: Annotated[
        list[Path] | None, typer.Option(help="OCI archives the node imports (default: the pause and operator images).")
    ] = None,
) -> None:
    """Start the control plane, or reuse the one already running from STATE_DIR."""
    images = image if image is not None else [Path("build/pause-image.oci.tar"), Path("build/undolog-image.oci.tar")]
    try:
        endpoints = LocalControlPlane(
            state_dir, bin_dir, durable=durable, node=node, images=images if node else ()
        ).up()
    except ControlPlaneError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(1) from error
    if endpoints.restarted:
        verb = f"restarted {', '.join(endpoints.restarted)} on its data, ready in {endpoints.started_in_seconds:.1f} s"
    elif endpoints.reused:
        verb = "already running"
    else:
        verb = f"ready in {endpoints.started_in_seconds:.1f} s"
    typer.echo(f"control plane {verb} at {endpoints.server}", err=True)
    typer.echo(f"export KUBECONFIG={endpoints.kubeconfig}")


@app.command()
def down(state_dir: StateDir = Path(".cluster"), bin_dir: BinDir = Path("bin")) -> None:
    """Stop every process of the control plane in STATE_DIR."""
    try:
        stopped = LocalControlPlane(state_dir, bin_dir).down()
    except ControlPlaneError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(1) from error
    typer.echo(f"stopped {len(stopped)} processes" if stopped else "nothing was running", err=True)


@app.command()
def reset(state_dir: StateDir = Path(".cluster"), bin_dir: BinDir = Path("bin")) -> None:
    """Stop the control plane in STATE_DIR and delete its data: every saga, for good."""
    try:
        stopped = LocalControlPlane(state_dir, bin_dir).reset()
    except ControlPlaneError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(1) from error
    typer.echo(f"stopped {len(stopped)} processes and deleted {state_dir}", err=True)


if __name__ == "__main__":
    app()
