"""Top-level command: groups the subcommands."""

from __future__ import annotations

import typer

from undolog.cli import cluster
from undolog.cli.operator import operator

app = typer.Typer(
    name="undolog",
    help="UndoLog: undoable multi-step work on Kubernetes.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(cluster.app, name="cluster")
app.command()(operator)


def main() -> None:
    app()
