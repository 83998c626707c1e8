"""`undolog verify`: every way an orchestrated saga can fail, run for real and checked."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from undolog.cli.triage import fail, run, table, target
from undolog.inspect import Inspector
from undolog.verify import Run, Verifier, scratch_namespace


def documents(paths: list[Path]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The one Saga and the Webhooks in these manifests."""
    found: list[dict[str, Any]] = []
    for path in paths:
        try:
            found += [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]
        except (OSError, yaml.YAMLError) as error:
            fail(f"{path}: {error}")
    sagas = [d for d in found if d.get("kind") == "Saga"]
    if len(sagas) != 1:
        fail(f"expected exactly one Saga in {', '.join(map(str, paths))}, found {len(sagas)}")
    return sagas[0], [d for d in found if d.get("kind") == "Webhook"]


def verify(
    ctx: typer.Context,
    manifests: Annotated[
        list[Path], typer.Argument(metavar="FILE...", help="The saga manifest, and the Webhooks it calls.")
    ],
    namespace: Annotated[
        str | None,
        typer.Option("--namespace", "-n", help="Run in this namespace (default: a scratch one, deleted after)."),
    ] = None,
    timeout: Annotated[float, typer.Option(help="Seconds each run may take.")] = 120.0,
) -> None:
    """Run an orchestrated saga once per way it can fail (after each step; in each compensation)
    against its participants, and check each run undid everything in order. Exit 1 on any gap."""
    saga, webhooks = documents(manifests)
    where = target(ctx, namespace=namespace)

    async def runs(inspector: Inspector) -> tuple[str, list[Run]]:
        scratch = namespace or await scratch_namespace(inspector.kube)
        try:
            return scratch, await Verifier(inspector.kube, scratch, timeout).verify(saga, webhooks)
        finally:
            if namespace is None:
                await inspector.kube.delete_namespace(scratch)

    scratch, done = run(where, runs)
    rows = [
        [
            r.point.label,
            r.saga,
            str(r.phase or "-"),
            ", ".join(r.undone) or "-",
            f"{r.seconds:.1f}s",
            "; ".join(r.gaps) or "none",
        ]
        for r in done
    ]
    name = saga.get("metadata", {}).get("name", "saga")
    typer.echo(f"Compensation paths of {name} (in namespace {scratch})")
    typer.echo(table(["FAILURE", "RUN", "PHASE", "UNDONE (IN ORDER)", "TIME", "GAPS"], rows))
    failed = [r for r in done if r.gaps]
    if failed:
        typer.echo(f"{len(failed)} of {len(done)} failure points leave a gap", err=True)
        raise typer.Exit(1)
    typer.echo(f"all {len(done)} failure points undone in order")
