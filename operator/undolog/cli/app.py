"""Top-level command: groups the subcommands."""

from __future__ import annotations

from typing import Annotated

import typer

from undolog import errors
from undolog.cli import triage
from undolog.cli.archive import archive
from undolog.cli.connection import NamespacedCommand, UserCommand
from undolog.cli.dashboard import dashboard
from undolog.cli.history import history
from undolog.cli.mcp import mcp
from undolog.cli.operator import operator
from undolog.cli.verify import verify
from undolog.version import __version__

app = typer.Typer(
    name="undolog",
    help="UndoLog: undoable multi-step work on Kubernetes.",
    epilog=triage.EXIT_CODES,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def print_version(asked: bool) -> None:
    if asked:
        typer.echo(f"undolog {__version__}")
        raise typer.Exit()


@app.callback()
def undolog(
    version: Annotated[
        bool, typer.Option("--version", callback=print_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """UndoLog: undoable multi-step work on Kubernetes."""


def version_command() -> None:
    """Print the version (the client's; the operator's is on its pod's image)."""
    typer.echo(f"undolog {__version__}")


app.command()(operator)
app.command(cls=UserCommand)(dashboard)
app.command(cls=UserCommand)(mcp)
app.command("list", cls=NamespacedCommand, epilog=triage.EXIT_CODES)(triage.list_sagas)
triaging = (triage.show, triage.plan, triage.retry, triage.skip, triage.undo_anyway, triage.abort, triage.rewind)
for command in (*triaging, triage.wait, history):
    app.command(cls=NamespacedCommand, epilog=triage.EXIT_CODES)(command)
app.command(cls=UserCommand, epilog=triage.EXIT_CODES)(verify)
app.command("version")(version_command)
app.add_typer(archive)


def main() -> None:
    try:
        app()
    except errors.KubeconfigInvalid as error:  # the operator and the gateway read it as they run
        typer.echo(f"error: {error}", err=True)
        raise SystemExit(1) from None
