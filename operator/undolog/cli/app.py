"""Top-level command: groups the subcommands."""

from __future__ import annotations

import typer

from undolog.cli import triage
from undolog.cli.operator import operator

app = typer.Typer(
    name="undolog",
    help="UndoLog: undoable multi-step work on Kubernetes.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.command()(operator)
app.command("list")(triage.list_sagas)
for command in (triage.show, triage.plan, triage.retry, triage.skip, triage.abort, triage.wait):
    app.command()(command)


def main() -> None:
    app()
