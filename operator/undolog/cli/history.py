"""`undolog history`: finished sagas from the archive, gone from the cluster or not, with the
filters of `undolog list` and the archive's own (finished since/until, text in the reason)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

import typer

from undolog.api import Saga, SagaPhase
from undolog.archive import HistoryQuery
from undolog.cli.triage import (
    AllNamespaces,
    NoHeaders,
    Output,
    OutputOption,
    document,
    emit,
    printable,
    printed,
    printing,
    run,
    table,
    target,
)
from undolog.conventions import now
from undolog.inspect import HistoryListing, Inspector, age, duration


def moment(text: str | None, option: str) -> datetime | None:
    """A time as RFC 3339, or an age ("7d": seven days ago)."""
    if text is None:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        pass
    try:
        return now() - duration(text)
    except ValueError as bad:
        raise typer.BadParameter(f"{bad}, nor a time such as 2026-12-01T08:00:00Z", param_hint=option) from None


def history_row(saga: Saga, output: Output, with_namespace: bool) -> list[str]:
    status = saga.status
    row = [
        saga.metadata.name,
        status.phase or "",
        str(status.stack_depth),
        str(status.compensated_count),
        status.reason or "",
        age(status.completion_time),
    ]
    if with_namespace:
        row.insert(0, saga.metadata.namespace)
    if output == Output.wide:
        row += [saga.spec.org_id or "", status.failed_step or "", (status.message or "").replace("\n", " ")[:120]]
    return row


def render_history(listing: HistoryListing, output: Output, with_namespace: bool) -> str:
    sagas = listing.sagas
    if output in (Output.json, Output.yaml):
        return document([s.to_api() for s in sagas], output)
    if output == Output.name:
        return "\n".join(f"saga.undolog.io/{s.metadata.name}" for s in sagas)
    header = ["NAME", "PHASE", "STEPS", "UNDONE", "REASON", "FINISHED"]
    if with_namespace:
        header.insert(0, "NAMESPACE")
    if output == Output.wide:
        header += ["ORG", "FAILED-STEP", "MESSAGE"]
    return table(header, [history_row(s, output, with_namespace) for s in sagas])


def history(
    ctx: typer.Context,
    all_namespaces: AllNamespaces = False,
    phase: Annotated[
        SagaPhase | None, typer.Option(case_sensitive=False, help="Only sagas that finished in this phase.")
    ] = None,
    org: Annotated[str | None, typer.Option(help="Only this spec.orgId.")] = None,
    principal: Annotated[
        str | None, typer.Option(help="Only sagas the gateway opened for this caller (spec.principal).")
    ] = None,
    function: Annotated[
        str | None, typer.Option(help="Only sagas that called this function (forward or undo).")
    ] = None,
    since: Annotated[str | None, typer.Option(help="Finished at or after: a time, or an age such as 7d.")] = None,
    until: Annotated[str | None, typer.Option(help="Finished before: a time, or an age such as 1d.")] = None,
    text: Annotated[
        str | None, typer.Option(help="Only sagas whose reason, message or failure (why it was undone) contains this.")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=10_000, help="At most this many, newest first.")] = 100,
    output: OutputOption = "table",
    no_headers: NoHeaders = False,
    archive_dsn: Annotated[
        str | None,
        typer.Option(envvar="UNDOLOG_ARCHIVE_DSN", help="The archive's PostgreSQL connection string (libpq's)."),
    ] = None,
) -> None:
    """Finished sagas from the archive, newest first; only of namespaces where you may list sagas."""
    how = printing(output, no_headers)
    where = target(ctx, all_namespaces)
    if archive_dsn:
        where = where.with_archive(archive_dsn)
    query = HistoryQuery(
        phase=phase.value if phase else None,
        org=org,
        principal=principal,
        function=function,
        since=moment(since, "--since"),
        until=moment(until, "--until"),
        text=text,
        limit=limit,
    )

    async def fetch(inspector: Inspector) -> HistoryListing:
        return await inspector.history(where.scope, query)

    listed = run(where, fetch)
    if listed.sagas or how.output not in (Output.table, Output.wide):
        items = [s.to_api() for s in listed.sagas]
        emit(how, printed(how, items, lambda output: render_history(listed, output, all_namespaces)))
    else:
        typer.echo(
            "No archived sagas found" + ("." if all_namespaces else f" in {where.namespace} namespace."), err=True
        )
    if listed.refused:  # on stderr, like kubectl's warnings
        shown = ", ".join(listed.refused[:10]) + (
            f" and {len(listed.refused) - 10} more" if len(listed.refused) > 10 else ""
        )
        typer.echo(printable(f"warning: left out the namespaces you may not list sagas in: {shown}"), err=True)
