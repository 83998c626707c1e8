"""The read model people use: list sagas, show one, plan its compensation, and ask for a
resolution (retry, skip, abort). The CLI renders it; the dashboard renders the same.

Everything here reads with the caller's own credentials and decides with the same rules as
the operator (decisions.compensation_plan, decisions.resolutions): what `plan` shows is what
the operator would do, and a resolution refused here would be refused by the operator too.
Requests are annotations the operator consumes; it stays the only writer of phases.
"""

from __future__ import annotations

import asyncio
import re
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from undolog import errors
from undolog.api import EntryReason, LostEntry, Outcome, Rewind, Saga, SagaPhase, UndoEntry, Webhook
from undolog.archive import ArchivedSaga, ArchiveStore, ArchiveUnavailable, HistoryQuery
from undolog.calls.registry import Registry
from undolog.conventions import (
    ABORT_REASON_ANNOTATION,
    ORG_LABEL,
    RETRY_ANNOTATION,
    SKIP_ANNOTATION,
    UNDO_ANYWAY_ANNOTATION,
    now,
    shown_duration,
    shown_url,
    timestamp,
)
from undolog.decisions import compensation_plan, object_undo, resolutions, rewind
from undolog.decisions.arguments import resolve
from undolog.decisions.phases import TERMINAL
from undolog.errors import CallNotPossible, CommandError
from undolog.kube import EventRecord, Kube
from undolog.ledger import Ledger, UnreadableSaga, WaitTimedOut, parse_saga, until

OWN_LISTINGS = 50  # sagas whose entries are listed one saga at a time; for more, one listing of all
# Halted first (a person is needed), then what is moving, then what is done.
PHASE_ORDER: dict[SagaPhase | None, int] = {
    SagaPhase.HALTED: 0,
    SagaPhase.FAILED: 1,
    SagaPhase.COMPENSATING: 2,
    SagaPhase.REWINDING: 2,
    SagaPhase.ACTIVE: 3,
    None: 3,
    SagaPhase.COMPLETED: 4,
    SagaPhase.COMPENSATED: 5,
}


def age_of(saga: Saga, moment: datetime) -> timedelta:
    created = saga.metadata.creation_timestamp
    return moment - created if created else timedelta(0)


@dataclass(frozen=True)
class CompensationPlan:
    steps: list[PlannedCompensation]
    # Entries UndoLog cannot read that no person has acknowledged yet: the operator halts when it
    # reaches one (EntryLost); under onFailure Halt the steps below it wait until a person retries.
    halts_on: list[LostEntry]
    finished: SagaPhase | None = None  # a saga that is Completed or Compensated: nothing to plan


@dataclass(frozen=True)
class SagaListing:
    sagas: list[Saga]  # halted first, then oldest first
    unreadable: list[UnreadableSaga]  # the API took them, UndoLog cannot read them
    version: str = ""  # what the listing is consistent at: `changes(since=version)` misses nothing after it


@dataclass(frozen=True)
class SagaDetail:
    saga: Saga
    entries: list[UndoEntry]  # newest first: the undo stack as drawn
    events: list[EventRecord]  # oldest first: the timeline
    # Entries of the saga the API took and UndoLog cannot read, with why: the operator halts when
    # its compensation reaches one (reported in status.lostEntries), so they are shown, not left out.
    unreadable: list[LostEntry] = field(default_factory=list)
    archived: bool = False  # read from the archive: the saga is gone from the cluster (read-only)


@dataclass(frozen=True)
class HistoryListing:
    sagas: list[Saga]  # newest finished first
    # Namespaces that hold matching archived sagas the caller may not list sagas in: left out.
    refused: list[str] = field(default_factory=list)
    next_page: tuple[datetime, str] | None = None  # pass as `before` for the next page


def archived_events(record: ArchivedSaga) -> list[EventRecord]:
    return [
        EventRecord(
            time=e.at, type="Warning" if e.warning else "Normal", reason=e.reason, message=e.message, name=e.name
        )
        for e in record.events
    ]


@dataclass(frozen=True)
class PlannedCompensation:
    """One compensation the operator would make, in order: entries with the same order are
    compensated together (independent steps, see dependsOn); under strict LIFO one per order."""

    order: int
    entry: UndoEntry
    target: str | None  # where it would be sent; None when it cannot be
    args: Any
    refusal: str | None  # why it cannot be sent (nothing would be); or "no compensation: skipped"


ConflictField = tuple[str, Any, Any, Any]  # a field, and its value before the step, after it and now
SECRET_VALUE = "(a Secret's value, not shown)"


def hidden(value: Any) -> Any:
    """A Secret's value as a person is shown it: whether there is one."""
    return None if value is None else SECRET_VALUE


def conflict_fields(entry: UndoEntry) -> list[ConflictField] | None:
    """What a person sees of an undo stopped because what its step left changed since: each
    field with its values before the step, right after it and now (a guard's selection as one
    row); None when nothing stopped it. The CLI's `show` and the dashboard print the same."""
    seen = entry.status.guard
    if seen is None or not (seen.differing or seen.now is not None or entry.status.reason == EntryReason.CONFLICT):
        return None
    native = entry.spec.kubernetes
    if native is not None:  # an object: its fields, not three whole manifests
        before, after, current = (i if isinstance(i, dict) else None for i in (native.before, seen.after, seen.now))
        fields = object_undo.conflicting_fields(before, after, current)
        if native.object.kind == "Secret":  # which keys changed is shown, never a value
            return [(name, hidden(was), hidden(left), hidden(now)) for name, was, left, now in fields]
        return fields
    guard = entry.spec.guard
    left = seen.after if seen.after is not None else seen.after_digest or "(not recorded)"
    return [(", ".join(seen.differing) or "the value", guard.before if guard else None, left, seen.now)]


def age(moment: datetime | None) -> str:
    """How long ago, the way kubectl says it (4s, 3m, 2h, 5d)."""
    return "" if moment is None else shown_duration(now() - moment)


def expires_in(saga: Saga) -> str:
    """When retention deletes a finished saga (status.expiresAt): "in 23h", "due"; "" when kept."""
    expires = saga.status.expires_at
    if expires is None:
        return ""
    left = expires - now()
    return f"in {shown_duration(left)}" if left.total_seconds() > 0 else "due"


DURATION = re.compile(r"(?:([0-9]+)d)?(?:([0-9]+)h)?(?:([0-9]+)m)?(?:([0-9]+)s)?")


def duration(text: str) -> timedelta:
    """A kubectl-style age (90s, 15m, 2h, 3d, 1h30m), for the CLI's --older-than and the
    dashboard's filter alike. ValueError names the text: a typo is said, never read as "no filter"."""
    shown = repr(text[:40] + ("…" if len(text) > 40 else ""))
    parts = DURATION.fullmatch(text.strip())
    if not text.strip() or parts is None:
        raise ValueError(f"{shown} is not a duration such as 90s, 15m, 2h or 1h30m")
    try:  # Python's own bounds: 4,300 digits per integer, 999,999,999 days
        days, hours, minutes, seconds = (int(part or 0) for part in parts.groups())
        return timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
    except (ValueError, OverflowError):
        raise ValueError(f"{shown} is longer than any age (at most {timedelta.max.days} days)") from None


def field_value(value: str) -> str:
    """A value in a field selector, escaped as the API parses it (`\\`, `,` and `=`)."""
    return value.replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=")


@dataclass
class Inspector:
    kube: Kube
    archive: ArchiveStore | None = None  # finished sagas kept after retention deleted them

    def _archive(self) -> ArchiveStore:
        if self.archive is None:
            raise CommandError(
                "no archive to read history from: give --archive-dsn (or UNDOLOG_ARCHIVE_DSN), the PostgreSQL "
                "database the operator archives to"
            )
        return self.archive

    async def history(self, namespace: str | None, query: HistoryQuery) -> HistoryListing:
        """Archived sagas, newest finished first, of the namespaces where the caller may list sagas
        (asked of the API for the caller, as the live views are): another tenant's are never read."""
        archive = self._archive()
        allowed: list[str] | None
        refused: list[str] = []
        try:
            if namespace is not None:
                if not await self.kube.may("list", "sagas", namespace):
                    raise CommandError(f"you may not list sagas in namespace {namespace!r}, so not their history")
                allowed = [namespace]
            elif await self.kube.may("list", "sagas", None):
                allowed = None
            else:
                found = await archive.namespaces(replace(query, namespaces=None))
                verdicts = await asyncio.gather(*(self.kube.may("list", "sagas", ns) for ns in found))
                allowed = [ns for ns, ok in zip(found, verdicts, strict=True) if ok]
                refused = [ns for ns, ok in zip(found, verdicts, strict=True) if not ok]
            rows = await archive.history(replace(query, namespaces=allowed))
        except ArchiveUnavailable as error:
            raise CommandError(str(error)) from None
        sagas = [Saga.model_validate(row.saga) for row in rows]
        last = rows[-1] if len(rows) == query.limit else None
        return HistoryListing(sagas, refused, (last.finished_at, last.uid) if last else None)

    async def archived(self, namespace: str, name: str) -> SagaDetail | None:
        """The saga as the archive keeps it, if it does and the caller may list sagas there."""
        if self.archive is None or not await self.kube.may("list", "sagas", namespace):
            return None
        try:
            record = await self.archive.saga(namespace, name)
        except ArchiveUnavailable as error:
            raise CommandError(f"saga {name!r} is not in namespace {namespace!r}, and {error}") from None
        if record is None:
            return None
        saga, entries = record.restored()
        return SagaDetail(saga, compensation_plan.newest_first(entries), archived_events(record), archived=True)

    @property
    def ledger(self) -> Ledger:
        return Ledger(self.kube)

    # -- reading -------------------------------------------------------------------------------

    async def listing(
        self,
        namespace: str | None = None,
        *,
        phase: SagaPhase | None = None,
        org: str | None = None,
        principal: str | None = None,
        function: str | None = None,
        older_than: timedelta | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> SagaListing:
        """Sagas of a namespace (or all), halted first, then oldest first. `principal`: sagas the
        gateway opened for it (spec.principal). `function`: sagas that call it to undo a step; the
        ages compare with the saga's creation. With them, the sagas the API took and UndoLog
        cannot read (whatever the filters: their fields are unknown)."""
        selector = ",".join(
            part
            for part in (
                f"{ORG_LABEL}={org}" if org else "",
                label_selector or "",
            )
            if part
        )
        fields = [f"spec.principal={field_value(principal)}" if principal else "", field_selector or ""]
        parsed, version = await self.ledger.sagas(
            namespace, label_selector=selector or None, field_selector=",".join(f for f in fields if f) or None
        )
        listed = [s for s in parsed if isinstance(s, Saga)]
        unreadable = [s for s in parsed if isinstance(s, UnreadableSaga)]
        if phase:  # from the status: the phase label is written only when a saga waits
            listed = [s for s in listed if s.status.phase == phase]
        moment = now()
        if older_than is not None:
            listed = [s for s in listed if age_of(s, moment) >= older_than]
        if function:
            calling = {key for key, functions in (await self.functions(namespace)).items() if function in functions}
            listed = [s for s in listed if s.key in calling]
        ordered = sorted(
            listed,
            key=lambda s: (
                PHASE_ORDER.get(s.status.phase, 9),
                s.metadata.creation_timestamp or moment,
                s.metadata.name,
            ),
        )
        return SagaListing(ordered, unreadable, version)

    async def functions(self, namespace: str | None) -> dict[tuple[str, str], set[str]]:
        """The compensation functions each saga's entries call, by (namespace, saga)."""
        called: dict[tuple[str, str], set[str]] = defaultdict(set)
        for entry in await self.ledger.entries(namespace):
            if entry.spec.compensation is not None:
                called[(entry.metadata.namespace, entry.spec.saga)].add(entry.spec.compensation.function)
        return called

    async def compensations_called(self, sagas: list[Saga], namespace: str | None) -> set[str]:
        """The compensation functions the entries of `sagas` (in `namespace`, or all) call: each
        saga's own entries while they are few. One halted saga among thousands cost every list
        page a listing of every entry in view, again at each live refresh."""
        if len(sagas) > OWN_LISTINGS:
            called = await self.functions(namespace)
            return {function for saga in sagas for function in called.get(saga.key, ())}
        listings = await asyncio.gather(*(self.ledger.entries_of(saga) for saga in sagas))
        return {e.spec.compensation.function for found in listings for e in found.entries if e.spec.compensation}

    async def halted_on(self, function: str, namespace: str | None = None) -> list[Saga]:
        """Halted sagas that wait on `function`: what to retry once it is fixed."""
        halted = (await self.listing(namespace, phase=SagaPhase.HALTED)).sagas
        waiting = []
        for saga in halted:
            if resolutions.halted_on(saga, await self.entries(saga)) == function:
                waiting.append(saga)
        return waiting

    async def webhook(self, namespace: str, name: str) -> Webhook:
        try:
            return await self.ledger.webhook(namespace, name)
        except errors.NotFound:
            raise CommandError(f"no Webhook {name!r} in namespace {namespace!r}") from None

    async def current_version(self, namespace: str | None) -> str:
        """The sagas' resourceVersion now: `changes(since=...)` misses nothing after it."""
        return await self.kube.current_version("sagas", namespace)

    async def changes(
        self, namespace: str | None, name: str | None = None, since: str | None = None
    ) -> AsyncIterator[Saga | None]:
        """Each change of the sagas in scope (or of one), as it happens, from now on (or since a
        resourceVersion: of a listing, or from `current_version`): the saga, or None when it was
        deleted. For live pages and `--watch`, which go on from what they showed: a watch begun
        later misses what changed in between."""
        version = since or await self.current_version(namespace)
        while True:
            async for kind, body in self.kube.watch("sagas", namespace, version):
                version = body["metadata"]["resourceVersion"]
                if kind == "BOOKMARK" or (name is not None and body["metadata"]["name"] != name):
                    continue
                parsed = None if kind == "DELETED" else parse_saga(body)
                if not isinstance(parsed, UnreadableSaga):  # one that cannot be read has no row to change
                    yield parsed

    async def saga(self, namespace: str, name: str) -> Saga:
        try:
            saga = await self.ledger.saga_as_listed(namespace, name)
        except errors.NotFound:
            raise CommandError(f"saga {name!r} not found in namespace {namespace!r}") from None
        if isinstance(saga, UnreadableSaga):
            raise CommandError(
                f"saga {name!r} in namespace {namespace!r} cannot be read ({saga.why}): the operator leaves it "
                "alone; fix the manifest, or delete it and apply it again"
            )
        return saga

    async def entries(self, saga: Saga) -> list[UndoEntry]:
        return compensation_plan.newest_first((await self.ledger.entries_of(saga)).entries)

    async def show(self, namespace: str, name: str) -> SagaDetail:
        """The saga, its undo stack and its timeline; from the archive once it is gone (read-only)."""
        try:
            saga = await self.saga(namespace, name)
        except CommandError:
            kept = await self.archived(namespace, name)
            if kept is None:
                raise
            return kept
        listing, events = await asyncio.gather(
            self.ledger.entries_of(saga), self.kube.events_about(namespace, name, saga.metadata.uid)
        )
        entries = compensation_plan.newest_first(listing.entries)
        return SagaDetail(saga, entries, events, [u.lost for u in listing.unreadable])

    async def plan(self, namespace: str, name: str) -> CompensationPlan:
        """What a compensation would do now (or after a retry), in order, without doing it."""
        saga = await self.saga(namespace, name)
        if saga.status.phase in TERMINAL:  # an answer, not an error: `undolog plan` exits 0
            return CompensationPlan([], [], finished=saga.status.phase)
        listing = await self.ledger.entries_of(saga)
        entries = compensation_plan.newest_first(listing.entries)
        acknowledged = {lost.name for lost in saga.status.lost_entries if lost.acknowledged}
        halts_on = [u.lost for u in listing.unreadable if u.lost.name not in acknowledged]
        outputs = rewind.outputs(entries)
        registry = Registry(self.ledger)
        planned = []
        in_order = [(order, e) for order, wave in enumerate(compensation_plan.waves(entries), start=1) for e in wave]
        for order, entry in in_order:
            call, native = entry.spec.compensation, entry.spec.kubernetes
            if native is not None:
                planned.append(PlannedCompensation(order, entry, f"the API, as {native.act_as.user}", None, None))
                continue
            if call is None:
                planned.append(PlannedCompensation(order, entry, None, None, "no compensation: skipped"))
                continue
            try:
                args = resolve(call.args, outputs, missing_as_null=True)
                target = await registry.target(namespace, call, with_headers=False)
            except CallNotPossible as refused:
                planned.append(PlannedCompensation(order, entry, None, None, str(refused)))
                continue
            planned.append(PlannedCompensation(order, entry, shown_url(target.url), args, None))
        return CompensationPlan(planned, halts_on)

    # -- resolutions (annotations the operator consumes) -------------------------------------

    async def actor(self) -> str:
        try:
            return await self.kube.whoami()
        except errors.KubeError:
            return "unknown user"

    async def stamp(self, text: str) -> str:
        """The reason, with who asked and when: kept on the saga or entry and in an Event."""
        return f"{text} (by {await self.actor()} at {timestamp()[:19]}Z)"

    async def retry_all(self, sagas: list[Saga], reason: str) -> list[tuple[Saga, str | None]]:
        """A batch retry: each saga with the refusal that stopped it (None: requested)."""
        done: list[tuple[Saga, str | None]] = []
        for saga in sagas:
            try:
                await self.retry(saga.metadata.namespace, saga.metadata.name, reason)
                done.append((saga, None))
            except (CommandError, errors.KubeError) as refused:
                done.append((saga, refused.message if isinstance(refused, errors.KubeError) else str(refused)))
        return done

    async def retry(self, namespace: str, name: str, reason: str) -> Saga:
        saga = await self.saga(namespace, name)
        verdict = resolutions.retry(saga)
        if isinstance(verdict, resolutions.Refused):
            raise CommandError(verdict.why)
        await self.ledger.annotate("sagas", namespace, name, {RETRY_ANNOTATION: await self.stamp(reason)})
        return saga

    async def skip(self, namespace: str, name: str, position: int, reason: str) -> UndoEntry:
        return await resolve_entry(self, namespace, name, position, reason, resolutions.skip, SKIP_ANNOTATION)

    async def undo_anyway(self, namespace: str, name: str, position: int, reason: str) -> UndoEntry:
        """A person's undo of an entry halted as Conflict, overwriting the later change."""
        rule, annotation = resolutions.undo_anyway, UNDO_ANYWAY_ANNOTATION
        return await resolve_entry(self, namespace, name, position, reason, rule, annotation)

    async def abort(self, namespace: str, name: str, reason: str) -> Saga:
        saga = await self.saga(namespace, name)
        verdict = resolutions.abort(saga)
        if isinstance(verdict, resolutions.Refused):
            raise CommandError(verdict.why)
        annotations = {ABORT_REASON_ANNOTATION: await self.stamp(reason)}
        return await self.ledger.request_outcome(namespace, name, Outcome.ABORT, annotations)

    async def rewind(self, namespace: str, name: str, to: str | int, reason: str) -> Rewind:
        """Ask for a rewind (spec.rewind) to a position or a step, checked by the shared rules."""
        saga = await self.saga(namespace, name)
        try:
            position = rewind.position_of(to, await self.entries(saga))
        except ValueError as error:
            raise CommandError(f"saga {name!r}: {error}") from None
        request = Rewind(to_position=position, reason=await self.stamp(reason))
        refused = rewind.may_request(saga, request)
        if refused:
            raise CommandError(refused)
        await self.ledger.request_rewind(namespace, name, request)
        return request

    async def wait(self, namespace: str, name: str, phase: SagaPhase, within: float, poll: float = 0.2) -> Saga:
        """Until the saga is in `phase`; CommandError when it can no longer get there or time runs out."""

        def settled(saga: Saga) -> Saga | None:
            if saga.status.phase in TERMINAL and saga.status.phase != phase:
                raise CommandError(f"saga {name!r} ended {saga.status.phase}; it will never be {phase}")
            return saga if saga.status.phase == phase else None

        try:
            return await until(lambda: self.saga(namespace, name), settled, within=within, poll=poll)
        except errors.Unavailable as unreachable:
            raise CommandError(f"saga {name!r} could not be read for {within:g} s: {unreachable.message}") from None
        except WaitTimedOut as late:
            raise CommandError(f"saga {name!r} is {late.saga.status.phase}, not {phase}, after {within:g} s") from None


async def resolve_entry(
    inspector: Inspector,
    namespace: str,
    name: str,
    position: int,
    reason: str,
    rule: Callable[[Saga, UndoEntry], resolutions.Verdict],
    annotation: str,
) -> UndoEntry:
    """A person's resolution of one entry (skip, undo anyway), checked by its rule, annotated."""
    saga = await inspector.saga(namespace, name)
    entries = {e.spec.stack_position: e for e in await inspector.entries(saga)}
    entry = entries.get(position)
    if entry is None:
        raise CommandError(f"saga {name!r} has no entry at position {position} (it has {sorted(entries)})")
    verdict = rule(saga, entry)
    if isinstance(verdict, resolutions.Refused):
        raise CommandError(verdict.why)
    await inspector.ledger.annotate(
        "undoentries", namespace, entry.metadata.name, {annotation: await inspector.stamp(reason)}
    )
    return entry
