"""`undolog archive check`: archive rows that lack entries, found and mended (archive/mend.py),
as the operator does at start."""

from __future__ import annotations

from typing import Annotated

import typer

from undolog.archive.mend import ARCHIVED_AGAIN, SAGA_GONE, MendReport, mend
from undolog.cli.connection import UserCommand
from undolog.cli.triage import run, table, target
from undolog.errors import CommandError
from undolog.inspect import Inspector

archive = typer.Typer(
    name="archive", help="The archive (PostgreSQL) of finished sagas.", no_args_is_help=True, rich_markup_mode=None
)
ArchiveDsn = Annotated[
    str | None,
    typer.Option(envvar="UNDOLOG_ARCHIVE_DSN", help="The archive's PostgreSQL connection string (libpq's)."),
]


@archive.command(
    "check",
    cls=UserCommand,
    epilog="Exit codes: 0 every row is whole now; 1 a row lacks entries that cannot be mended.",
)
def check(ctx: typer.Context, archive_dsn: ArchiveDsn = None) -> None:
    """Find archived rows that lack some of their saga's entries (written by an earlier release):
    archive each again, whole, while its saga is in the cluster; name those whose saga is gone."""
    where = target(ctx, True)
    if archive_dsn:
        where = where.with_archive(archive_dsn)

    async def mended(inspector: Inspector) -> MendReport:
        if inspector.archive is None:
            raise CommandError("no archive to check: give --archive-dsn (or UNDOLOG_ARCHIVE_DSN)")
        return await mend(inspector.archive, inspector.ledger)

    report = run(where, mended)
    rows = [[f.row.namespace, f.row.name, f.row.uid, f.row.missing or "", f.outcome] for f in report.mended]
    if rows:
        typer.echo(table(["NAMESPACE", "NAME", "UID", "MISSING", "OUTCOME"], rows))
    again = sum(1 for f in report.mended if f.outcome == ARCHIVED_AGAIN)
    gone = sum(1 for f in report.mended if f.outcome == SAGA_GONE)
    unchecked = len(report.mended) - again - gone
    typer.echo(
        f"{report.whole + len(report.mended)} rows not known whole checked: {report.whole} whole, {again} archived "
        f"again, {gone} whose saga is gone (that history is lost), {unchecked} not checked",
        err=True,
    )
    if gone or unchecked:
        raise typer.Exit(1)
