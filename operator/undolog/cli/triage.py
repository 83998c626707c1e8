"""The on-call commands: find halted sagas, read their stack and timeline, resolve them.

    undolog list                      halted first, across namespaces
    undolog show SAGA                 the undo stack and the event timeline
    undolog plan SAGA                 what a compensation would do now, without doing it
    undolog retry SAGA                retry a Halted saga
    undolog skip SAGA POSITION --reason TEXT
    undolog abort SAGA --reason TEXT
    undolog wait SAGA --for PHASE --timeout SECONDS

Exit codes: 0 done; 1 the saga or entry is missing, the action does not fit its phase, the
API refused (RBAC), or a wait timed out.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any, NoReturn, TypeVar

import typer
import yaml
from rich.console import Console
from rich.table import Table

from undolog.api.saga import Saga
from undolog.api.undo_entry import UndoEntry
from undolog.calls import registry
from undolog.controller.forward import owned_by
from undolog.decisions import lifo
from undolog.decisions.arguments import UnresolvedReference, resolve
from undolog.decisions.phases import (
    ABORT_REASON_ANNOTATION,
    PHASE_LABEL,
    RETRY_ANNOTATION,
    SKIP_ANNOTATION,
    TERMINAL,
)
from undolog.kube import ApiException, Body, Kube, default_namespace, refusal

T = TypeVar("T")
# Colour only on a terminal (rich decides); piped output is wide enough not to wrap tables.
console = Console(highlight=False, width=None if sys.stdout.isatty() else int(os.environ.get("COLUMNS", "200")))
errors = Console(stderr=True, highlight=False)

# Halted first (a person is needed), then what is moving, then what is done.
PHASE_ORDER = {"Halted": 0, "Failed": 1, "Compensating": 2, "Active": 3, "Completed": 4, "Compensated": 5}


class Output(StrEnum):
    table = "table"
    json = "json"
    yaml = "yaml"


class CommandError(Exception):
    """A refusal the user can act on; printed without a traceback, exit code 1."""


Namespace = Annotated[
    str | None, typer.Option("--namespace", "-n", help="Namespace of the saga (default: the kubeconfig's).")
]


def fail(message: str) -> NoReturn:
    errors.print(f"[red]error:[/red] {message}")
    raise typer.Exit(1)


def run(command: Callable[[Kube], Awaitable[T]]) -> T:
    """Connect, run, close; API refusals and CommandErrors become one clear line and exit 1."""

    async def main() -> T:
        kube = await Kube.connect()
        try:
            return await command(kube)
        finally:
            await kube.close()

    try:
        return asyncio.run(main())
    except CommandError as error:
        fail(str(error))
    except ApiException as error:
        if error.status == 403:
            fail(f"forbidden: {refusal(error)}")
        fail(refusal(error))


async def get_saga(kube: Kube, namespace: str, name: str) -> Body:
    try:
        return await kube.get("sagas", namespace, name)
    except ApiException as error:
        if error.status == 404:
            raise CommandError(f"saga {name!r} not found in namespace {namespace!r}") from error
        raise


async def saga_in(kube: Kube, namespace: str, name: str, phases: tuple[str | None, ...], only: str) -> Body:
    """The saga, if its phase allows the action; `only` says which sagas do."""
    body = await get_saga(kube, namespace, name)
    phase = body.get("status", {}).get("phase")
    if phase not in phases:
        raise CommandError(f"saga {name!r} is {phase}: {only}")
    return body


async def entries_of(kube: Kube, saga: Body) -> list[UndoEntry]:
    meta = saga["metadata"]
    listed = await kube.list("undoentries", meta["namespace"], field_selector=f"spec.saga={meta['name']}")
    entries = [UndoEntry.model_validate(e) for e in listed if owned_by(e, meta["uid"])]
    return sorted(entries, key=lambda e: e.spec.stack_position, reverse=True)


def age(timestamp: str | datetime | None) -> str:
    if timestamp is None:
        return ""
    moment = datetime.fromisoformat(timestamp) if isinstance(timestamp, str) else timestamp
    seconds = int((datetime.now(UTC) - moment).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{max(seconds, 0)}s"


def clock(moment: datetime | None) -> str:
    return moment.strftime("%H:%M:%S.%f")[:-3] if moment else ""


async def actor(kube: Kube) -> str:
    try:
        return await kube.whoami()
    except ApiException:
        return "unknown user"


def stamp(who: str, text: str) -> str:
    return f"{text} (by {who} at {datetime.now(UTC).isoformat(timespec='seconds').replace('+00:00', 'Z')})"


# -- list ------------------------------------------------------------------------------------


def list_sagas(
    namespace: Annotated[str | None, typer.Option("--namespace", "-n", help="Only this namespace.")] = None,
    phase: Annotated[str | None, typer.Option(help="Only sagas in this phase, e.g. Halted.")] = None,
    org: Annotated[str | None, typer.Option(help="Only this spec.orgId.")] = None,
    output: Annotated[Output, typer.Option("--output", "-o", help="table, json or yaml.")] = Output.table,
) -> None:
    """Sagas across namespaces, halted first: phase, steps, undone, reason, age."""
    selector = ",".join(
        part
        for part in (
            f"{PHASE_LABEL}={phase.lower()}" if phase else "",
            f"undolog.io/org={org}" if org else "",
        )
        if part
    )

    async def fetch(kube: Kube) -> list[Body]:
        return await kube.list("sagas", namespace, label_selector=selector or None)

    sagas = sorted(
        run(fetch),
        key=lambda s: (
            PHASE_ORDER.get(s.get("status", {}).get("phase", ""), 9),
            s["metadata"]["creationTimestamp"],
        ),
    )
    if output == Output.json:
        console.print_json(json.dumps({"apiVersion": "v1", "kind": "List", "items": sagas}))
        return
    if output == Output.yaml:
        console.print(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": sagas}, sort_keys=False), end="")
        return
    if not sagas:
        errors.print("no sagas found" + (f" in namespace {namespace}" if namespace else ""))
        return
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in ("NAMESPACE", "NAME", "PHASE", "STEPS", "UNDONE", "REASON", "AGE"):
        table.add_column(column)
    for body in sagas:
        status = body.get("status", {})
        phase_text = status.get("phase", "")
        style = {"Halted": "bold red", "Failed": "red", "Compensating": "yellow", "Completed": "green"}.get(phase_text)
        table.add_row(
            body["metadata"]["namespace"],
            body["metadata"]["name"],
            f"[{style}]{phase_text}[/{style}]" if style else phase_text,
            str(status.get("stackDepth", 0)),
            str(status.get("compensatedCount", 0)),
            status.get("reason", ""),
            age(body["metadata"]["creationTimestamp"]),
        )
    console.print(table)


# -- show ------------------------------------------------------------------------------------


def show(saga: str, namespace: Namespace = None) -> None:
    """The undo stack (newest first) and the event timeline of one saga."""
    ns = namespace or default_namespace()

    async def fetch(kube: Kube) -> tuple[Body, list[UndoEntry], list[Any]]:
        body = await get_saga(kube, ns, saga)
        return body, await entries_of(kube, body), await kube.events_about(ns, saga, body["metadata"]["uid"])

    body, entries, events = run(fetch)
    parsed = Saga.model_validate(body)
    status = parsed.status
    console.print(f"[bold]{ns}/{saga}[/bold]  {status.phase or 'New'}  {status.reason or ''}")
    if status.message:
        console.print(status.message)
    if status.failed_step:
        console.print(f"failed step: {status.failed_step}")
    console.print(f"steps {status.stack_depth}, undone {status.compensated_count}\n")
    stack = Table(title="Undo stack (newest first)", box=None, header_style="bold", title_justify="left")
    for column in (
        "POS",
        "STEP",
        "FUNCTION",
        "EFFECT",
        "STATE",
        "RETRIES",
        "LAST ERROR",
        "REGISTERED",
        "EXECUTED",
        "UNDONE",
    ):
        stack.add_column(column)
    for entry in entries:
        call = entry.spec.compensation
        stack.add_row(
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
        )
    console.print(stack)
    console.print()
    timeline = Table(title="Timeline", box=None, header_style="bold", title_justify="left")
    for column in ("TIME", "TYPE", "REASON", "MESSAGE"):
        timeline.add_column(column)
    for event in events:
        moment = event.event_time or event.last_timestamp or event.first_timestamp
        timeline.add_row(clock(moment), event.type or "", event.reason or "", event.message or "")
    console.print(timeline)


# -- plan ------------------------------------------------------------------------------------


def plan(saga: str, namespace: Namespace = None) -> None:
    """What a compensation would do now, in order, without doing it."""
    ns = namespace or default_namespace()

    async def fetch(kube: Kube) -> list[tuple[UndoEntry, str, Any]]:
        body = await get_saga(kube, ns, saga)
        entries = await entries_of(kube, body)
        parsed = Saga.model_validate(body)
        if parsed.status.phase in TERMINAL:
            raise CommandError(f"saga {saga!r} is {parsed.status.phase}: there is nothing left to compensate")
        outputs = {e.spec.step: e.status.output for e in entries}
        owed = [e for e in entries if e.status.state in (*lifo.OWED, "Failed")]
        steps = []
        for entry in sorted(owed, key=lambda e: e.spec.stack_position, reverse=True):
            call = entry.spec.compensation
            if call is None:
                steps.append((entry, "skip: no compensation", None))
                continue
            try:
                target = (await registry.resolve(kube, ns, call)).url
                args: Any = resolve(call.args, outputs, missing_as_null=True)
            except (registry.CallNotPossible, UnresolvedReference) as error:
                target, args = f"cannot call: {error}", None
            steps.append((entry, target, args))
        return steps

    steps = run(fetch)
    if not steps:
        console.print(f"nothing to compensate in {ns}/{saga}")
        return
    table = Table(title=f"Compensation plan of {ns}/{saga}", box=None, header_style="bold", title_justify="left")
    for column in ("ORDER", "POS", "STEP", "STATE", "CALL", "TARGET", "ARGS"):
        table.add_column(column)
    for order, (entry, target, args) in enumerate(steps, start=1):
        call = entry.spec.compensation
        table.add_row(
            str(order),
            str(entry.spec.stack_position),
            entry.spec.step,
            entry.status.state,
            f"{call.function} {call.version}" if call else "-",
            target,
            json.dumps(args) if args is not None else "",
        )
    console.print(table)


# -- resolutions -----------------------------------------------------------------------------


def retry(
    saga: str,
    namespace: Namespace = None,
    reason: Annotated[str, typer.Option(help="Why it can be retried now.")] = "retry requested",
) -> None:
    """Retry a Halted saga: its Failed entries go back to Pending and it resumes."""
    ns = namespace or default_namespace()

    async def act(kube: Kube) -> None:
        await saga_in(kube, ns, saga, ("Halted",), "only a Halted saga can be retried")
        note = stamp(await actor(kube), reason)
        await kube.patch("sagas", ns, saga, {"metadata": {"annotations": {RETRY_ANNOTATION: note}}})

    run(act)
    console.print(f"retry requested for {ns}/{saga}; follow it with `undolog wait {saga} -n {ns} --for Compensated`")


def skip(
    saga: str,
    position: int,
    reason: Annotated[str, typer.Option(help="Why this entry needs no compensation (kept on the entry).")],
    namespace: Namespace = None,
) -> None:
    """Mark one entry of a Halted saga Skipped (undone by hand) and let the saga go on."""
    ns = namespace or default_namespace()

    async def act(kube: Kube) -> None:
        body = await saga_in(kube, ns, saga, ("Halted",), "only entries of a Halted saga can be skipped")
        entries = {e.spec.stack_position: e for e in await entries_of(kube, body)}
        entry = entries.get(position)
        if entry is None:
            raise CommandError(f"saga {saga!r} has no entry at position {position} (it has {sorted(entries)})")
        if entry.status.state not in ("Failed", "Pending") and entry.status.effect != "Failed":
            raise CommandError(
                f"entry {entry.metadata.name} is {entry.status.state}: only a Pending or Failed entry can be skipped"
            )
        note = stamp(await actor(kube), reason)
        await kube.patch("undoentries", ns, entry.metadata.name, {"metadata": {"annotations": {SKIP_ANNOTATION: note}}})

    run(act)
    console.print(f"entry {saga}-{position} will be skipped; the saga then goes on")


def abort(
    saga: str,
    reason: Annotated[str, typer.Option(help="Why the saga is aborted (kept in its status).")],
    namespace: Namespace = None,
) -> None:
    """Abort an Active saga: it fails and is compensated, newest first."""
    ns = namespace or default_namespace()

    async def act(kube: Kube) -> None:
        await saga_in(kube, ns, saga, (None, "Active"), "only an Active saga can be aborted")
        note = stamp(await actor(kube), reason)
        patch = {"metadata": {"annotations": {ABORT_REASON_ANNOTATION: note}}, "spec": {"outcome": "Abort"}}
        await kube.patch("sagas", ns, saga, patch)

    run(act)
    console.print(f"{ns}/{saga} aborted; it will be compensated newest-first")


def wait(
    saga: str,
    for_: Annotated[str, typer.Option("--for", help="The phase to wait for, e.g. Compensated.")],
    namespace: Namespace = None,
    timeout: Annotated[float, typer.Option(help="Seconds before giving up (exit 1).")] = 60.0,
) -> None:
    """Wait until a saga reaches a phase."""
    ns = namespace or default_namespace()
    wanted = for_.capitalize()

    async def act(kube: Kube) -> str:
        deadline = time.monotonic() + timeout
        while True:
            phase = (await get_saga(kube, ns, saga)).get("status", {}).get("phase")
            if phase == wanted:
                return str(phase)
            if phase in TERMINAL:
                raise CommandError(f"saga {saga!r} ended {phase}; it will never be {wanted}")
            if time.monotonic() > deadline:
                raise CommandError(f"saga {saga!r} is {phase}, not {wanted}, after {timeout:g} s")
            await asyncio.sleep(0.2)

    console.print(f"{ns}/{saga} is {run(act)}")
