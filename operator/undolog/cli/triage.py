"""The on-call commands, with kubectl's habits: find halted sagas, read their stack and
timeline, see what a compensation would do, resolve them.

    undolog list [-A] [--phase Halted] [-o wide|json|yaml|name] [--watch]
    undolog show SAGA [-o json|yaml|name] [--watch]
    undolog plan SAGA [-o wide|json|yaml|name]
    undolog retry SAGA | -l SELECTOR | --function F   --reason TEXT
    undolog skip SAGA POSITION --reason TEXT
    undolog undo-anyway SAGA POSITION --reason TEXT
    undolog abort SAGA --reason TEXT
    undolog wait SAGA --for PHASE --timeout SECONDS

Every command takes -n/--namespace (default: the kubeconfig context's), --context,
--kubeconfig, --as and --as-group (impersonation, checked by the API), declared once in
cli/connection.py. The commands render the
read model (undolog.inspect) as plain text; the rules are the operator's own.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Annotated, Any, NoReturn, TypeVar

import typer
import yaml

from undolog import errors
from undolog.api import EntryState, Saga, SagaPhase, UndoEntry
from undolog.archive import ArchiveStore
from undolog.cli import printers
from undolog.cli.connection import connection
from undolog.inspect import (
    Inspector,
    PlannedCompensation,
    SagaDetail,
    SagaListing,
    age,
    conflict_fields,
    duration,
    expires_in,
)
from undolog.kube import Kube, default_namespace

T = TypeVar("T")
EXIT_CODES = (
    "Exit codes: 0 done; 1 the saga or entry is missing, the action does not fit its phase, the API "
    "refused (RBAC), or a wait timed out; 2 a usage error."
)


class Output(StrEnum):
    table = "table"
    wide = "wide"
    json = "json"
    yaml = "yaml"
    name = "name"
    jsonpath = "jsonpath"  # with =TEMPLATE
    custom_columns = "custom-columns"  # with =SPEC


TEMPLATED = (Output.jsonpath, Output.custom_columns)


@dataclass(frozen=True)
class Printing:
    """-o and --no-headers as given: a format, and its template for jsonpath= or custom-columns=."""

    output: Output
    template: str = ""
    headers: bool = True


def printing(text: str, no_headers: bool = False) -> Printing:
    kind, equals, template = text.partition("=")
    try:
        output = Output(kind)
    except ValueError:
        choices = ", ".join(o.value + ("=..." if o in TEMPLATED else "") for o in Output)
        raise typer.BadParameter(f"{text!r} is not an output format ({choices})", param_hint="-o") from None
    if (output in TEMPLATED) != bool(equals and template):
        want = f"{kind}= needs a template, e.g. -o jsonpath='{{.metadata.name}}'" if output in TEMPLATED else ""
        raise typer.BadParameter(want or f"-o {kind} takes no template", param_hint="-o")
    return Printing(output, template, not no_headers)


def printed(how: Printing, items: list[dict[str, Any]], built_in: Callable[[Output], str], *, one: bool = False) -> str:
    """What a command prints: its own format, or a template over its objects (`one`: the object
    itself, as kubectl's get of a named object, else a List of them)."""
    try:
        if how.output == Output.jsonpath:
            return printers.jsonpath(
                how.template, items[0] if one else {"apiVersion": "v1", "kind": "List", "items": items}
            )
        if how.output == Output.custom_columns:
            rows = printers.custom_columns(how.template, items)
            return table(rows[0], rows[1:], headers=how.headers)
    except printers.TemplateError as bad:
        raise typer.BadParameter(str(bad), param_hint="-o") from None
    text = built_in(how.output)
    if how.headers or how.output not in (Output.table, Output.wide):
        return text
    return "\n".join(text.splitlines()[1:])


def emit(how: Printing, text: str) -> None:
    """Print it; a jsonpath template as it is, with no newline added (kubectl's)."""
    typer.echo(text, nl=how.output != Output.jsonpath)


OutputOption = Annotated[
    str,
    typer.Option(
        "--output", "-o", help="table, wide, json, yaml, name, jsonpath=TEMPLATE or custom-columns=NAME:EXPR,..."
    ),
]
NoHeaders = Annotated[bool, typer.Option("--no-headers", help="Tables without their header line.")]


# -- connecting as kubectl does -------------------------------------------------------------------


def _saga_names(ctx: typer.Context, incomplete: str) -> list[str]:
    """Shell completion of SAGA: the sagas of the namespace the command line names."""
    params = ctx.params
    target = Target(params.get("kubeconfig"), params.get("context"), params.get("namespace"), None, ())

    async def names(inspector: Inspector) -> list[str]:
        return [s.metadata.name for s in (await inspector.listing(target.namespace)).sagas]

    try:
        return [n for n in asyncio.run(target.run(names)) if n.startswith(incomplete)]
    except (errors.UndoLogError, OSError):
        return []


SagaName = Annotated[str, typer.Argument(help="The saga's name.", autocompletion=_saga_names)]
AllNamespaces = Annotated[bool, typer.Option("--all-namespaces", "-A", help="Every namespace you may read.")]
Reason = Annotated[str, typer.Option(help="Why (kept on the saga or entry, with who and when).")]


@dataclass(frozen=True)
class Target:
    kubeconfig: str | None
    context: str | None
    namespace_option: str | None
    as_user: str | None
    as_groups: Sequence[str]
    all_namespaces: bool = False
    request_timeout: float | None = None  # --request-timeout, in seconds
    # The archive, for history and for sagas gone from the cluster (`undolog history --archive-dsn`).
    archive_dsn: str | None = field(default_factory=lambda: os.environ.get("UNDOLOG_ARCHIVE_DSN") or None)

    @property
    def namespace(self) -> str:
        return self.namespace_option or default_namespace(self.kubeconfig, self.context)

    def with_archive(self, dsn: str) -> Target:
        return replace(self, archive_dsn=dsn)

    @property
    def scope(self) -> str | None:
        """The namespace to list in; None for all."""
        return None if self.all_namespaces else self.namespace

    def run(self, command: Callable[[Inspector], Awaitable[T]]) -> Coroutine[Any, Any, T]:
        async def main() -> T:
            kube = await Kube.connect(
                self.kubeconfig,
                self.context,
                as_user=self.as_user,
                as_groups=tuple(self.as_groups),
                request_timeout=self.request_timeout,
            )
            archive = ArchiveStore(self.archive_dsn) if self.archive_dsn else None
            if archive is not None:
                await archive.open()
            try:
                return await command(Inspector(kube, archive))
            finally:
                await kube.close()
                if archive is not None:
                    await archive.close()

        return main()


def target(ctx: typer.Context, all_namespaces: bool = False, *, namespace: str | None = None) -> Target:
    """Where the command acts, from the connection options (cli/connection.py); `namespace`: a
    command's own -n, where it has one."""
    found = connection(ctx)
    return Target(
        found.kubeconfig,
        found.context,
        namespace or found.namespace,
        found.as_user,
        found.as_groups,
        all_namespaces,
        found.request_seconds,
    )


def fail(message: str) -> NoReturn:
    typer.echo(f"error: {printable(message)}", err=True)
    raise typer.Exit(1)


def described(error: errors.KubeError) -> str:
    """The API's message, and under it each cause its Status names (the field and what is wrong)."""
    causes = error.details.causes if error.details is not None else ()
    lines = [f"  {c.field}: {c.message}" if c.field else f"  {c.message}" for c in causes]
    return "\n".join([error.message, *lines])


def run(where: Target, command: Callable[[Inspector], Awaitable[T]]) -> T:
    """Connect as the kubeconfig (and --as) says, run, close; refusals become one clear line on
    stderr and exit code 1."""
    try:
        return asyncio.run(where.run(command))
    except errors.CommandError as error:
        fail(str(error))
    except errors.Unauthorized as error:
        fail(f"unauthorized: {error.message}: the API did not accept the kubeconfig's credentials; log in again")
    except errors.Forbidden as error:
        fail(f"forbidden: {described(error)}")
    except errors.KubeError as error:
        fail(described(error))
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


# -- rendering: plain text, never styled or wrapped ---------------------------------------------------


# Control characters (C0, DEL, C1) in text others wrote (a participant's error answer, an agent's
# abort reason): printed raw, an ESC sequence would restyle or rewrite the person's terminal.
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """`text` with each control character shown as its escape (ESC as \\x1b), never sent as is."""
    return _UNPRINTABLE.sub(lambda match: f"\\x{ord(match.group()):02x}", text)


def table(header: Sequence[str], rows: Sequence[Sequence[str]], *, headers: bool = True) -> str:
    """Columns padded like kubectl's; every cell printable."""
    rows = [[printable(str(cell)) for cell in row] for row in rows]
    shown = [header, *rows] if headers else rows
    widths = [max((len(str(row[i])) for row in shown), default=0) for i in range(len(header))]
    lines = ["   ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)) for row in shown]
    return "\n".join(line.rstrip() for line in lines)


def clock(moment: datetime | None) -> str:
    """RFC 3339 in UTC to the millisecond: a time read a day later, or in another zone, is still right."""
    if moment is None:
        return ""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def older(text: str | None) -> timedelta | None:
    if text is None:
        return None
    try:
        return duration(text)
    except ValueError as bad:
        raise typer.BadParameter(str(bad), param_hint="--older-than") from None


def document(items: list[dict[str, Any]], output: Output) -> str:
    listing = {"apiVersion": "v1", "kind": "List", "items": items}
    if output == Output.json:
        return json.dumps(listing, indent=2)
    return yaml.safe_dump(listing, sort_keys=False, allow_unicode=True).rstrip("\n")


def saga_row(saga: Saga, output: Output, with_namespace: bool) -> list[str]:
    status = saga.status
    row = [
        saga.metadata.name,
        status.phase or "",
        str(status.stack_depth),
        str(status.compensated_count),
        status.reason or "",
        age(saga.metadata.creation_timestamp),
    ]
    if with_namespace:
        row.insert(0, saga.metadata.namespace)
    if output == Output.wide:
        row += [
            expires_in(saga),
            saga.spec.org_id or "",
            status.failed_step or "",
            saga.spec.principal or "",
            (status.message or "").replace("\n", " ")[:120],
        ]
    return row


def saga_header(output: Output, with_namespace: bool) -> list[str]:
    header = ["NAME", "PHASE", "STEPS", "UNDONE", "REASON", "AGE"]
    if with_namespace:
        header.insert(0, "NAMESPACE")
    if output == Output.wide:
        header += ["EXPIRES", "ORG", "FAILED-STEP", "PRINCIPAL", "MESSAGE"]
    return header


def render_sagas(sagas: list[Saga], output: Output, with_namespace: bool) -> str:
    if output in (Output.json, Output.yaml):
        return document([s.to_api() for s in sagas], output)
    if output == Output.name:
        return "\n".join(f"saga.undolog.io/{s.metadata.name}" for s in sagas)
    rows = [saga_row(s, output, with_namespace) for s in sagas]
    return table(saga_header(output, with_namespace), rows)


def render_detail(detail: SagaDetail, output: Output) -> str:
    saga = detail.saga
    if output in (Output.json, Output.yaml):
        return document([saga.to_api(), *(e.to_api() for e in detail.entries)], output)
    if output == Output.name:
        return f"saga.undolog.io/{saga.metadata.name}"
    status = saga.status
    lines = [f"{saga.reference}  {status.phase or '<none>'}  {status.reason or ''}".rstrip()]
    if detail.archived:
        lines.append(f"archived: gone from the cluster, read-only (finished {age(status.completion_time)} ago)")
    if saga.spec.principal:
        lines.append(f"opened for: {printable(saga.spec.principal)}")
    if status.message:
        lines.append(printable(status.message))
    if status.failed_step:
        lines.append(f"failed step: {printable(status.failed_step)}")
    lines += [f"steps {status.stack_depth}, undone {status.compensated_count}", "", "Undo stack (newest first)"]
    stack = [(e.spec.stack_position, entry_row(e)) for e in detail.entries]
    for lost in detail.unreadable:  # the API took them, UndoLog cannot read them: the operator halts on them
        at = lost.stack_position
        row = ["?" if at is None else str(at), lost.step or "?", lost.function or "?", "?", "Unreadable", ""]
        stack.append((at if at is not None else sys.maxsize, [*row, lost.why[:80], "", "", ""]))
    header = ["POS", "STEP", "FUNCTION", "EFFECT", "STATE", "RETRIES", "LAST ERROR", "REGISTERED", "EXECUTED", "UNDONE"]
    lines += [table(header, [row for _, row in sorted(stack, key=lambda r: -r[0])])]
    lines += conflicts(detail.entries)
    lines += ["", "Timeline"]
    events = [[clock(e.time), e.type, e.reason, e.message.replace("\n", " ")] for e in detail.events]
    lines.append(table(["TIME", "TYPE", "REASON", "MESSAGE"], events))
    return "\n".join(lines)


def conflicts(entries: Sequence[UndoEntry]) -> list[str]:
    """What each guard saw where it stopped an undo: each field before the step, right after it,
    and now, for the person who decides."""
    lines = []
    for entry in entries:
        fields = conflict_fields(entry)
        if fields is None:
            continue
        seen = entry.status.guard
        lines.append(
            f"{entry.spec.stack_position} {entry.spec.step}: changed since the step"
            + (f" ({', '.join(seen.differing)})" if seen and seen.differing else "")
        )
        for name, before, after, current in fields:
            said = f"before {shown_value(before)}, after {shown_value(after)}, now {shown_value(current)}"
            lines.append(f"  {name}: {said}")
        if seen and seen.overridden:
            lines.append(f"  undone anyway: {printable(seen.overridden)}")
    return ["", "Conflicts", *lines] if lines else []


def shown_value(value: Any) -> str:
    return printable(json.dumps(value, sort_keys=True))[:300]


def last_said(entry: UndoEntry) -> str | None:
    """The error a person still has to read: none once the entry is Compensated (a 404 retried
    and then answered is over), the reason it was skipped once Skipped."""
    status = entry.status
    if status.state == EntryState.COMPENSATED:
        return None
    return status.skip_reason if status.state == EntryState.SKIPPED else status.last_error or status.skip_reason


def entry_row(entry: UndoEntry) -> list[str]:
    """An entry's row in the undo stack of `undolog show`."""
    status = entry.status
    return [
        str(entry.spec.stack_position),
        entry.spec.step,
        entry.spec.undone_with,
        status.effect,
        status.state,
        str(status.retry_count),
        (last_said(entry) or "").replace("\n", " ")[:80],
        clock(entry.spec.registered_at),
        clock(status.executed_at),
        clock(status.compensated_at),
    ]


def plan_items(planned: list[PlannedCompensation]) -> list[dict[str, Any]]:
    return [
        {
            "order": p.order,
            "entry": p.entry.metadata.name,
            "stackPosition": p.entry.spec.stack_position,
            "step": p.entry.spec.step,
            "state": p.entry.status.state.value,
            "function": p.entry.spec.compensation.function if p.entry.spec.compensation else None,
            "target": p.target,
            "args": p.args,
            "refusal": p.refusal,
        }
        for p in planned
    ]


def render_plan(where: str, planned: list[PlannedCompensation], output: Output) -> str:
    if output in (Output.json, Output.yaml):
        return document(plan_items(planned), output)
    if output == Output.name:
        return "\n".join(f"undoentry.undolog.io/{p.entry.metadata.name}" for p in planned)
    if not planned:
        return f"nothing to compensate in {where}"
    rows = []
    for step in planned:
        row = [
            str(step.order),
            str(step.entry.spec.stack_position),
            step.entry.spec.step,
            step.entry.status.state,
            step.entry.spec.undone_with,
            step.target or f"cannot call: {step.refusal}",
            json.dumps(step.args) if step.args is not None else "",
        ]
        rows.append([*row, step.entry.metadata.name] if output == Output.wide else row)
    header = ["ORDER", "POS", "STEP", "STATE", "CALL", "TARGET", "ARGS"]
    return f"Compensation plan of {where}\n" + table([*header, "ENTRY"] if output == Output.wide else header, rows)


# -- reading -------------------------------------------------------------------------------------


def list_sagas(
    ctx: typer.Context,
    all_namespaces: AllNamespaces = False,
    phase: Annotated[
        SagaPhase | None, typer.Option(case_sensitive=False, help="Only sagas in this phase, e.g. Halted.")
    ] = None,
    org: Annotated[str | None, typer.Option(help="Only this spec.orgId.")] = None,
    principal: Annotated[
        str | None, typer.Option(help="Only sagas the gateway opened for this caller (spec.principal).")
    ] = None,
    function: Annotated[str | None, typer.Option(help="Only sagas that call this function to undo a step.")] = None,
    selector: Annotated[str | None, typer.Option("--selector", "-l", help="A label selector.")] = None,
    field_selector: Annotated[
        str | None,
        typer.Option(
            help="A field selector: metadata.name, status.phase, spec.orgId, spec.principal; e.g. status.phase=Halted."
        ),
    ] = None,
    older_than: Annotated[str | None, typer.Option(help="Only sagas older than this, e.g. 15m.")] = None,
    output: OutputOption = "table",
    no_headers: NoHeaders = False,
    watch: Annotated[bool, typer.Option("--watch", "-w", help="Then print each change as it happens.")] = False,
) -> None:
    """Sagas, halted first: phase, steps, undone, reason, age."""
    how = printing(output, no_headers)
    where = target(ctx, all_namespaces)
    minimum_age = older(older_than)

    async def fetch(inspector: Inspector) -> SagaListing:
        return await inspector.listing(
            where.scope,
            phase=phase,
            org=org,
            principal=principal,
            function=function,
            older_than=minimum_age,
            label_selector=selector,
            field_selector=field_selector,
        )

    listed = run(where, fetch)
    sagas = listed.sagas
    if sagas or how.output not in (Output.table, Output.wide):
        emit(how, listed_as(how, sagas, all_namespaces))
    elif not watch and not listed.unreadable:
        typer.echo("No sagas found" + ("." if all_namespaces else f" in {where.namespace} namespace."), err=True)
    for odd in listed.unreadable:  # on stderr, like kubectl's warnings: the output itself stays parseable
        typer.echo(
            printable(
                f"warning: saga {odd.namespace}/{odd.name} cannot be read ({odd.why}); the operator leaves it alone"
            ),
            err=True,
        )
    if watch:
        run(where, lambda inspector: follow(inspector, where.scope, None, how, all_namespaces, listed.version))


def listed_as(how: Printing, sagas: list[Saga], with_namespace: bool) -> str:
    return printed(how, [s.to_api() for s in sagas], lambda output: render_sagas(sagas, output, with_namespace))


async def follow(
    inspector: Inspector, scope: str | None, name: str | None, how: Printing, with_ns: bool, since: str | None
) -> None:
    """kubectl's --watch: a line (or document) per change after what was shown (`since`), until
    interrupted."""
    async for saga in inspector.changes(scope, name, since):
        if saga is None:
            continue
        if name is not None:
            emit(how, "\n" + detailed_as(how, await inspector.show(saga.metadata.namespace, name)))
        elif how.output in (Output.table, Output.wide):
            typer.echo(table(saga_header(how.output, with_ns), [saga_row(saga, how.output, with_ns)]).splitlines()[1])
        else:
            emit(how, listed_as(replace(how, headers=False), [saga], with_ns))


def show(
    ctx: typer.Context,
    saga: SagaName,
    output: OutputOption = "table",
    watch: Annotated[bool, typer.Option("--watch", "-w", help="Then show it again at each change.")] = False,
) -> None:
    """The undo stack (newest first) and the event timeline of one saga."""
    how = printing(output)
    where = target(ctx)
    detail = run(where, lambda inspector: inspector.show(where.namespace, saga))
    emit(how, detailed_as(how, detail))
    if watch:
        since = detail.saga.metadata.resource_version
        run(where, lambda inspector: follow(inspector, where.namespace, saga, how, False, since))


def detailed_as(how: Printing, detail: SagaDetail) -> str:
    """A template sees the saga itself (its entries are `undolog list`'s and kubectl's to read)."""
    return printed(how, [detail.saga.to_api()], lambda output: render_detail(detail, output), one=True)


def plan(
    ctx: typer.Context,
    saga: SagaName,
    output: OutputOption = "table",
    no_headers: NoHeaders = False,
) -> None:
    """What a compensation would do now (or after a retry), in order, without doing it."""
    how = printing(output, no_headers)
    where = target(ctx)
    planned = run(where, lambda inspector: inspector.plan(where.namespace, saga))
    if planned.finished is not None and how.output in (Output.table, Output.wide):
        typer.echo(f"saga {where.namespace}/{saga} is {planned.finished}: there is nothing left to compensate")
        return
    steps = planned.steps
    emit(how, printed(how, plan_items(steps), lambda out: render_plan(f"{where.namespace}/{saga}", steps, out)))
    for lost in planned.halts_on:  # on stderr, like kubectl's warnings: the plan itself stays parseable
        warning = (
            f"warning: entry {lost.name} cannot be read ({lost.why}): the operator halts when it reaches it (the "
            "entries above it are compensated first; under onFailure Halt those below it wait); undo its effect "
            f"by hand, then `undolog retry {saga}` goes on without it"
        )
        typer.echo(printable(warning), err=True)


# -- resolutions -----------------------------------------------------------------------------


def retry(
    ctx: typer.Context,
    saga: Annotated[
        str | None, typer.Argument(help="The saga; or -l / --function.", autocompletion=_saga_names)
    ] = None,
    reason: Reason = "retry requested",
    selector: Annotated[str | None, typer.Option("--selector", "-l", help="Every Halted saga matching it.")] = None,
    function: Annotated[str | None, typer.Option(help="Every saga halted on this function (after fixing it).")] = None,
    all_namespaces: AllNamespaces = False,
) -> None:
    """Retry a Halted saga (or a batch): Failed entries go back to Pending and it resumes."""
    if (saga is None) == (selector is None and function is None):
        raise typer.BadParameter("give a SAGA, or -l/--selector or --function for a batch")
    where = target(ctx, all_namespaces)
    if saga is not None:
        run(where, lambda inspector: inspector.retry(where.namespace, saga, reason))
        typer.echo(
            f"retry requested for {where.namespace}/{saga}; follow it with `undolog wait {saga} --for Compensated`"
        )
        return

    async def batch(inspector: Inspector) -> list[tuple[Saga, str | None]]:
        if function is not None:
            chosen = await inspector.halted_on(function, where.scope)
            if selector is not None:
                matching = {s.key for s in (await inspector.listing(where.scope, label_selector=selector)).sagas}
                chosen = [s for s in chosen if s.key in matching]
        else:
            chosen = (await inspector.listing(where.scope, phase=SagaPhase.HALTED, label_selector=selector)).sagas
        return await inspector.retry_all(chosen, reason)

    results = run(where, batch)
    if not results:
        fail("no Halted saga matches")
    for saga_object, refused in results:
        said = f"refused: {refused}" if refused else "retry requested"
        typer.echo(f"{saga_object.reference}: {printable(said)}")
    if any(refused for _, refused in results):
        raise typer.Exit(1)


def skip(
    ctx: typer.Context,
    saga: SagaName,
    position: Annotated[int, typer.Argument(help="The entry's stack position (`undolog show` lists them).")],
    reason: Reason,
) -> None:
    """Mark one entry of a Halted saga Skipped (undone by hand) and let the saga go on."""
    where = target(ctx)
    entry = run(where, lambda inspector: inspector.skip(where.namespace, saga, position, reason))
    typer.echo(f"entry {entry.metadata.name} will be skipped; the saga then goes on")


def undo_anyway(
    ctx: typer.Context,
    saga: SagaName,
    position: Annotated[int, typer.Argument(help="The entry's stack position (`undolog show` lists them).")],
    reason: Reason,
) -> None:
    """Undo one entry halted as Conflict all the same, overwriting what changed since its step."""
    where = target(ctx)
    entry = run(where, lambda inspector: inspector.undo_anyway(where.namespace, saga, position, reason))
    typer.echo(f"entry {entry.metadata.name} will be undone anyway, without its guard; the saga then goes on")


def abort(
    ctx: typer.Context,
    saga: SagaName,
    reason: Reason,
) -> None:
    """Abort an Active saga: it fails and is compensated, newest first."""
    where = target(ctx)
    run(where, lambda inspector: inspector.abort(where.namespace, saga, reason))
    typer.echo(f"{where.namespace}/{saga} aborted; it will be compensated newest-first")


def rewind(
    ctx: typer.Context,
    saga: SagaName,
    to: Annotated[
        str, typer.Option("--to", help="Keep this stack position (or this step's latest run); undo everything above.")
    ],
    reason: Reason,
) -> None:
    """Rewind an Active saga: undo the entries above a position, newest first, then go on from there."""
    where = target(ctx)
    position_or_step = int(to) if to.isdigit() else to
    request = run(where, lambda inspector: inspector.rewind(where.namespace, saga, position_or_step, reason))
    typer.echo(
        f"{where.namespace}/{saga} rewinds to position {request.to_position}: the entries above it are undone "
        "newest-first, then the saga is Active again (undolog show, or wait --for Active)"
    )


def wait(
    ctx: typer.Context,
    saga: SagaName,
    for_: Annotated[
        SagaPhase, typer.Option("--for", case_sensitive=False, help="The phase to wait for, e.g. Compensated.")
    ],
    timeout: Annotated[float, typer.Option(help="Seconds before giving up (exit 1).")] = 60.0,
) -> None:
    """Wait until a saga reaches a phase (exit 1 when it ends in another, or time runs out)."""
    where = target(ctx)
    reached = run(where, lambda inspector: inspector.wait(where.namespace, saga, for_, timeout))
    typer.echo(f"{where.namespace}/{saga} is {reached.status.phase}")


__all__ = ["EXIT_CODES", "abort", "list_sagas", "plan", "retry", "rewind", "show", "skip", "undo_anyway", "wait"]
