"""The on-call commands: find halted sagas, read their stack and timeline, resolve them.

    undolog list                      halted first
    undolog show SAGA                 the undo stack and the event timeline
    undolog plan SAGA                 what a compensation would do now, without doing it
    undolog retry SAGA --reason TEXT
    undolog skip SAGA POSITION --reason TEXT
    undolog abort SAGA --reason TEXT
    undolog wait SAGA --for PHASE --timeout SECONDS

The commands render the read model (undolog.inspect) as plain text; the rules are the
operator's own. Exit codes: 0 done; 1 the saga or entry is missing, the action does not fit
its phase, the API refused (RBAC), or a wait timed out.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, NoReturn, TypeVar

import typer
import yaml

from undolog import errors
from undolog.api import SagaPhase
from undolog.conventions import now
from undolog.inspect import Inspector
from undolog.kube import Kube, default_namespace

T = TypeVar("T")


class Output(StrEnum):
    table = "table"
    json = "json"
    yaml = "yaml"


Namespace = Annotated[
    str | None, typer.Option("--namespace", "-n", help="Namespace of the saga (default: the kubeconfig's).")
]


def fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(1)


def run(command: Callable[[Inspector], Awaitable[T]]) -> T:
    """Connect, run, close; refusals become one clear line on stderr and exit code 1."""

    async def main() -> T:
        kube = await Kube.connect()
        try:
            return await command(Inspector(kube))
        finally:
            await kube.close()

    try:
        return asyncio.run(main())
    except errors.CommandError as error:
        fail(str(error))
    except errors.Forbidden as error:
        fail(f"forbidden: {error.message}")
    except errors.KubeError as error:
        fail(error.message)


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns padded like kubectl's: plain text, never wrapped or styled."""
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    lines = [
        "   ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)) for row in [header, *rows]
    ]
    return "\n".join(line.rstrip() for line in lines)


def age(moment: datetime | None) -> str:
    if moment is None:
        return ""
    seconds = int((now() - moment).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{max(seconds, 0)}s"


def clock(moment: datetime | None) -> str:
    return moment.strftime("%H:%M:%S.%f")[:-3] if moment else ""


def dump(items: list[dict[str, Any]], output: Output) -> str:
    document = {"apiVersion": "v1", "kind": "List", "items": items}
    if output == Output.json:
        return json.dumps(document, indent=2)
    return yaml.safe_dump(document, sort_keys=False).rstrip("\n")


# -- list ------------------------------------------------------------------------------------


def list_sagas(
    namespace: Annotated[str | None, typer.Option("--namespace", "-n", help="Only this namespace.")] = None,
    phase: Annotated[SagaPhase | None, typer.Option(help="Only sagas in this phase, e.g. Halted.")] = None,
    org: Annotated[str | None, typer.Option(help="Only this spec.orgId.")] = None,
    output: Annotated[Output, typer.Option("--output", "-o", help="table, json or yaml.")] = Output.table,
) -> None:
    """Sagas, halted first: phase, steps, undone, reason, age."""
    sagas = run(lambda inspector: inspector.sagas(namespace, phase=phase, org=org))
    if output != Output.table:
        typer.echo(dump([s.to_api() for s in sagas], output))
        return
    if not sagas:
        typer.echo("no sagas found" + (f" in namespace {namespace}" if namespace else ""), err=True)
        return
    rows = [
        [
            s.metadata.namespace,
            s.metadata.name,
            s.status.phase or "",
            str(s.status.stack_depth),
            str(s.status.compensated_count),
            s.status.reason or "",
            age(s.metadata.creation_timestamp),
        ]
        for s in sagas
    ]
    typer.echo(table(["NAMESPACE", "NAME", "PHASE", "STEPS", "UNDONE", "REASON", "AGE"], rows))


# -- show ------------------------------------------------------------------------------------


def show(saga: str, namespace: Namespace = None) -> None:
    """The undo stack (newest first) and the event timeline of one saga."""
    ns = namespace or default_namespace()
    detail = run(lambda inspector: inspector.show(ns, saga))
    status = detail.saga.status
    lines = [f"{ns}/{saga}  {status.phase or '<none>'}  {status.reason or ''}".rstrip()]
    if status.message:
        lines.append(status.message)
    if status.failed_step:
        lines.append(f"failed step: {status.failed_step}")
    lines += [f"steps {status.stack_depth}, undone {status.compensated_count}", "", "Undo stack (newest first)"]
    stack = []
    for entry in detail.entries:
        call = entry.spec.compensation
        stack.append(
            [
                str(entry.spec.stack_position),
                entry.spec.step,
                f"{call.function} {call.version}" if call else "-",
                entry.status.effect,
                entry.status.state,
                str(entry.status.retry_count),
                (entry.status.last_error or entry.status.skip_reason or "")[:80],
                clock(entry.spec.registered_at),
                clock(entry.status.executed_at),
                clock(entry.status.compensated_at),
            ]
        )
    header = ["POS", "STEP", "FUNCTION", "EFFECT", "STATE", "RETRIES", "LAST ERROR", "REGISTERED", "EXECUTED", "UNDONE"]
    lines += [table(header, stack), "", "Timeline"]
    events = [[clock(e.time), e.type, e.reason, e.message] for e in detail.events]
    lines.append(table(["TIME", "TYPE", "REASON", "MESSAGE"], events))
    typer.echo("\n".join(lines))


# -- plan ------------------------------------------------------------------------------------


def plan(saga: str, namespace: Namespace = None) -> None:
    """What a compensation would do now, in order, without doing it."""
    ns = namespace or default_namespace()
    planned = run(lambda inspector: inspector.plan(ns, saga))
    if not planned:
        typer.echo(f"nothing to compensate in {ns}/{saga}")
        return
    rows = []
    for step in planned:
        call = step.entry.spec.compensation
        rows.append(
            [
                str(step.order),
                str(step.entry.spec.stack_position),
                step.entry.spec.step,
                step.entry.status.state,
                f"{call.function} {call.version}" if call else "-",
                step.target or f"cannot call: {step.refusal}",
                json.dumps(step.args) if step.args is not None else "",
            ]
        )
    typer.echo(f"Compensation plan of {ns}/{saga}")
    typer.echo(table(["ORDER", "POS", "STEP", "STATE", "CALL", "TARGET", "ARGS"], rows))


# -- resolutions -----------------------------------------------------------------------------


def retry(
    saga: str,
    namespace: Namespace = None,
    reason: Annotated[str, typer.Option(help="Why it can be retried now.")] = "retry requested",
) -> None:
    """Retry a Halted saga: its Failed entries go back to Pending and it resumes."""
    ns = namespace or default_namespace()
    run(lambda inspector: inspector.retry(ns, saga, reason))
    typer.echo(f"retry requested for {ns}/{saga}; follow it with `undolog wait {saga} -n {ns} --for Compensated`")


def skip(
    saga: str,
    position: int,
    reason: Annotated[str, typer.Option(help="Why this entry needs no compensation (kept on the entry).")],
    namespace: Namespace = None,
) -> None:
    """Mark one entry of a Halted saga Skipped (undone by hand) and let the saga go on."""
    ns = namespace or default_namespace()
    entry = run(lambda inspector: inspector.skip(ns, saga, position, reason))
    typer.echo(f"entry {entry.metadata.name} will be skipped; the saga then goes on")


def abort(
    saga: str,
    reason: Annotated[str, typer.Option(help="Why the saga is aborted (kept in its status).")],
    namespace: Namespace = None,
) -> None:
    """Abort an Active saga: it fails and is compensated, newest first."""
    ns = namespace or default_namespace()
    run(lambda inspector: inspector.abort(ns, saga, reason))
    typer.echo(f"{ns}/{saga} aborted; it will be compensated newest-first")


def wait(
    saga: str,
    for_: Annotated[SagaPhase, typer.Option("--for", help="The phase to wait for, e.g. Compensated.")],
    namespace: Namespace = None,
    timeout: Annotated[float, typer.Option(help="Seconds before giving up (exit 1).")] = 60.0,
) -> None:
    """Wait until a saga reaches a phase."""
    ns = namespace or default_namespace()
    reached = run(lambda inspector: inspector.wait(ns, saga, for_, timeout))
    typer.echo(f"{ns}/{saga} is {reached.status.phase}")
