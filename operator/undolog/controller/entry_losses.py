"""Entries a saga can no longer compensate (deleted, unreadable) and entries that name it but
are not its own: each reported once, on the saga's status and in an Event, never passed over."""

from __future__ import annotations

import asyncio
import logging

from undolog import errors
from undolog.api import MAX_LOST_ENTRIES, EntryReason, EventReason, LostEntry, Saga, UndoEntry
from undolog.api.changes import changed
from undolog.controller.context import DriverContext
from undolog.controller.saga_status import StatusWriter
from undolog.conventions import not_owned_why, owned_by
from undolog.decisions import entry_changes, lost_entries, phases
from undolog.decisions.lost_entries import lost_entry
from undolog.decisions.stack import Stack

log = logging.getLogger("undolog.engine")


class EntryLosses:
    __slots__ = ("context", "key", "lost", "status", "vanished", "wake")

    def __init__(self, context: DriverContext, key: tuple[str, str], status: StatusWriter, wake: asyncio.Event) -> None:
        self.context, self.key, self.status, self.wake = context, key, status, wake
        self.lost: list[LostEntry] = []  # entries gone since the last report, to be reported
        # Entries a watch saw deleted, read again before they are reported lost: one relabelled
        # out of a shard's watch reaches that watch as DELETED though it still exists, and its
        # saga halted with an entry "deleted by hand" that was not.
        self.vanished: list[UndoEntry] = []

    def lose(self, lost: LostEntry) -> None:
        """An entry can no longer be compensated: record it on the saga at the next report."""
        self.lost.append(lost)
        self.wake.set()

    def vanish(self, entry: UndoEntry) -> None:
        """A watch saw the entry deleted: lost if it is gone when read again."""
        self.vanished.append(entry)
        self.wake.set()

    async def report(self, saga: Saga, entries: Stack) -> Saga:
        """Everything noticed since the last report, said on the saga (never compensate from a
        stale copy): entries vanished and gone when read again, lost ones, unowned ones."""
        if self.vanished:
            await self.confirm_vanished(saga, entries)
        if self.lost:
            for lost in self.lost:
                entries.pop(lost.name)
            saga = await self.report_lost(saga)
        return await self.report_unowned(saga, entries)

    async def confirm_vanished(self, saga: Saga, entries: Stack) -> None:
        vanished, self.vanished = self.vanished, []
        for entry in vanished:
            try:
                found = await self.context.ledger.entry(*entry.key)
            except errors.NotFound:
                self.lost.append(lost_entry(entry, "deleted by hand"))
                continue
            self.context.index.restored(found)
            if owned_by(found, saga.metadata.uid):
                entries.put(found)

    async def report_lost(self, saga: Saga) -> Saga:
        """Record the entries lost since the last report on the saga. They are let go only once
        written: a write lost to another writer (409) left the saga compensated as though they
        had never been."""
        known = {e.name for e in saga.status.lost_entries}
        new = [e for e in self.lost if e.name not in known]
        if new:
            listed, omitted = lost_entries.recorded(saga.status.lost_entries, saga.status.lost_entries_omitted, new)
            status = changed(saga.status, {"lost_entries": listed, "lost_entries_omitted": omitted})
            saga = await self.status.write(saga, status)
            for entry in new:
                self.context.timeline.record(
                    saga,
                    EventReason.ENTRY_LOST,
                    f"{entry.name} (step {entry.step}) {entry.why} before it was compensated",
                    warning=True,
                )
        reported = {e.name for e in new} | known
        self.lost = [e for e in self.lost if e.name not in reported]  # those noticed meanwhile wait
        return saga

    async def report_unowned(self, saga: Saga, entries: Stack) -> Saga:
        """Entries that name the saga but are not its own (conventions.owned_by): each says why,
        on itself and in an Event, once; the saga names them (status.unownedEntries)."""
        if self.context.index.count(self.key) == len(entries) and not saga.status.unowned_entries:
            return saga  # every entry held is one of its own (the common case, at no cost per entry)
        unowned = await self._unowned(saga)
        names = sorted(e.metadata.name for e in unowned)[:MAX_LOST_ENTRIES]
        if names == saga.status.unowned_entries:
            return saga
        new = sorted(set(names) - set(saga.status.unowned_entries))
        saga = await self.status.write(saga, changed(saga.status, {"unowned_entries": names}))
        if new:
            self.context.timeline.record(
                saga,
                EventReason.ENTRY_NOT_OWNED,
                f"{', '.join(new)} name this saga but are not its own (ownerReferences): never compensated as its"
                " steps; see each entry's status.lastError",
                warning=True,
            )
        return saga

    async def _unowned(self, saga: Saga) -> list[UndoEntry]:
        """The unowned entries, each marked with why (once)."""
        ledger, uid = self.context.ledger, saga.metadata.uid
        unowned = [e for e in self.context.index.of(self.key).values() if not owned_by(e, uid)]
        if sorted(e.metadata.name for e in unowned) != saga.status.unowned_entries:
            # The index may hold only some (a finished saga's entries are let go): a listing tells.
            unowned = (await ledger.entries_of(saga)).unowned
        for entry in unowned:
            if entry.status.reason == EntryReason.NOT_OWNED_BY_SAGA:
                continue
            why = not_owned_why(entry, saga.metadata.name, uid)
            try:
                self.context.index.keep(await ledger.mark_not_owned(entry, why))
            except errors.NotFound:
                continue
            self.context.timeline.record(entry, EventReason.ENTRY_NOT_OWNED, why, warning=True)
        return unowned


async def report_orphans(context: DriverContext, key: tuple[str, str]) -> None:
    """Entries that name a saga that does not exist (in their namespace) are owed by nobody:
    said on each entry (reason SagaNotFound) and in a Warning Event, never ignored. They stay
    Pending; a saga created later under that name does not take them on (it does not own
    them: conventions.owned_by) but names them (status.unownedEntries)."""
    namespace, saga = key
    for entry in context.index.of(key).values():
        if not phases.unclaimed(entry):
            continue
        why = (
            f"no Saga {saga!r} in namespace {namespace}: nothing will compensate this entry until that saga "
            "exists (an entry belongs to the saga of its spec.saga in its own namespace)"
        )
        status = changed(entry.status, entry_changes.not_acted_on(EntryReason.SAGA_NOT_FOUND, why))
        try:
            context.index.keep(await context.ledger.write_entry_status(entry, status))
        except errors.KubeError as error:
            log.warning("could not record SagaNotFound on %s: %s", entry.reference, error.message)
            continue
        context.timeline.record(entry, EventReason.SAGA_NOT_FOUND, why, warning=True)
