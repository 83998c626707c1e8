"""Every finished saga written to the archive (undolog.archive), once per revision, with its
entries and the Events the operator emitted about it.

Finished sagas wait in a queue drained by one task, in batches of one transaction each. While
PostgreSQL cannot be reached they wait (`undolog_archive_backlog_sagas` and `_seconds` say how
many and since when) and nothing is deleted (retention asks `holds` first); the queue drains by
itself once it can. A saga's entries come with it from its driver when it has just finished;
otherwise (found finished on taking charge, or too many waiting to hold each in memory) they are
listed when its turn comes. Events are captured as they are emitted and written behind.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from undolog import errors, metrics
from undolog.api import Resource, Saga, UndoEntry
from undolog.api.common import revision_of
from undolog.archive import ArchivedEvent, ArchivedSaga, ArchiveStore, ArchiveUnavailable, archived_saga
from undolog.controller.concurrency import woken
from undolog.controller.entry_index import SagaKey
from undolog.conventions import now
from undolog.decisions.retention import Finished
from undolog.ledger import Ledger

log = logging.getLogger("undolog.archive")
BATCH = 50  # sagas per transaction
HELD = 1000  # sagas waiting with their entries in memory; past that, listed again when their turn comes
MAX_EVENTS = 100_000  # events waiting to be written while PostgreSQL is away; the oldest go past it
FLUSH_SECONDS = 1.0
RETRY_SECONDS = (1.0, 2.0, 5.0, 10.0)  # between tries while PostgreSQL cannot be reached
COLLECT_EVERY = timedelta(minutes=10)


@dataclass
class Waiting:
    saga: Finished
    held: tuple[Saga, list[UndoEntry]] | None  # the saga and its entries as its driver had them


class EventCapture:
    """The Events the timeline emits, kept for the archive until written (bounded)."""

    def __init__(self) -> None:
        self.waiting: deque[ArchivedEvent] = deque(maxlen=MAX_EVENTS)

    def __call__(
        self, regarding: Resource, reason: str, message: str, warning: bool, at: datetime, sequence: int
    ) -> None:
        meta = regarding.metadata
        saga_uid = (
            meta.uid
            if regarding.kind == "Saga"
            else next((ref.uid for ref in meta.owner_references if ref.kind == "Saga"), None)
        )
        if not saga_uid:
            return
        if len(self.waiting) == self.waiting.maxlen:
            metrics.archive_events_dropped.inc()
        self.waiting.append(ArchivedEvent(saga_uid, sequence, at, regarding.kind, meta.name, reason, message, warning))

    def take(self, uids: set[str] | None = None) -> list[ArchivedEvent]:
        """The waiting events (of these sagas only, when given), no longer waiting."""
        if uids is None:
            taken = list(self.waiting)
            self.waiting.clear()
            return taken
        taken = [e for e in self.waiting if e.saga_uid in uids]
        if taken:
            kept = [e for e in self.waiting if e.saga_uid not in uids]
            self.waiting.clear()
            self.waiting.extend(kept)
        return taken

    def put_back(self, events: Sequence[ArchivedEvent]) -> None:
        self.waiting.extendleft(reversed(events))


class Archiver:
    def __init__(self, store: ArchiveStore, ledger: Ledger, ttl: timedelta | None = None) -> None:
        self.store, self.ledger, self.ttl = store, ledger, ttl
        self.events = EventCapture()
        self.waiting: dict[str, Waiting] = {}  # by saga UID, oldest first
        self.archived: dict[str, int] = {}  # saga UID -> revision committed, for sagas still in etcd
        self.committed: list[Callable[[SagaKey], None]] = []  # told when a saga is archived (retention)
        self.wake = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []
        self.collected_at: datetime | None = None

    # -- what retention and the engine ask --------------------------------------------------------

    def holds(self, saga: Finished) -> bool:
        return self.archived.get(saga.uid, -1) >= (revision_of(saga.resource_version) or 0)

    def offer(self, saga: Finished, held: tuple[Saga, list[UndoEntry]] | None = None) -> None:
        """Archive this finished saga (if not archived at this revision yet)."""
        if self.holds(saga):
            return
        before = self.waiting.get(saga.uid)
        if before is not None and before.saga.resource_version == saga.resource_version and held is None:
            return  # the same copy, already waiting (with its entries if they came)
        if held is not None and sum(1 for w in self.waiting.values() if w.held) >= HELD:
            held = None
        self.waiting.pop(saga.uid, None)
        self.waiting[saga.uid] = Waiting(saga, held)
        self.wake.set()

    def forget(self, uid: str) -> None:
        """The saga is gone from etcd: nothing more to remember of it."""
        self.archived.pop(uid, None)

    # -- the work ----------------------------------------------------------------------------

    def start(self) -> None:
        self.tasks = [
            asyncio.create_task(self.run(), name="archive"),
            asyncio.create_task(self.write_events(), name="archive events"),
        ]

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.store.close()

    async def run(self) -> None:
        await self.store.open()
        failures = 0
        migrated = False
        while True:
            try:
                if not migrated:
                    version = await self.store.migrate()
                    log.info("archive schema at version %d", version)
                    migrated = True
                if self.waiting:
                    await self.drain()
                await self.collect_if_due()
                failures = 0
            except ArchiveUnavailable as error:
                log.warning("archive: %s; %d sagas wait", error, len(self.waiting))
                delay = RETRY_SECONDS[min(failures, len(RETRY_SECONDS) - 1)]
                failures += 1
                self.gauge()
                await asyncio.sleep(delay)
                continue
            self.gauge()
            if not self.waiting:
                self.wake.clear()
                await woken(self.wake, COLLECT_EVERY.total_seconds())

    async def drain(self) -> None:
        """One batch: what is not archived at its revision yet, read where its entries are not
        held, then written with its events in one transaction."""
        batch = list(self.waiting.values())[:BATCH]
        known = await self.store.revisions([w.saga.uid for w in batch])
        records: list[ArchivedSaga] = []
        unread = 0
        for waiting in batch:
            try:
                record = await self.record_of(waiting, known.get(waiting.saga.uid))
            except errors.KubeError as error:  # the API is away: it waits its turn again
                log.warning("archive: could not read %s: %s", waiting.saga.key, error.message)
                self.waiting[waiting.saga.uid] = self.waiting.pop(waiting.saga.uid)
                unread += 1
                continue
            if record is None:
                self.waiting.pop(waiting.saga.uid, None)
            else:
                records.append(record)
        if unread == len(batch):
            await asyncio.sleep(RETRY_SECONDS[0])
            return
        events = self.events.take({r.uid for r in records})
        try:
            await self.store.write(records, events)
        except ArchiveUnavailable:
            self.events.put_back(events)
            raise
        for record in records:
            self.done(record.uid, record.key, record.revision)
        metrics.archived_sagas.inc(len(records))

    async def record_of(self, waiting: Waiting, known: tuple[int, int] | None) -> ArchivedSaga | None:
        """The row to write; None when there is nothing to write (archived already, or gone)."""
        saga = waiting.saga
        revision = revision_of(saga.resource_version) or 0
        if known is not None and known[0] >= revision:
            self.done(saga.uid, saga.key, known[0])
            return None
        if waiting.held is not None:
            return archived_saga(*waiting.held)
        try:
            current = await self.ledger.saga(saga.namespace, saga.name)
            if current.metadata.uid != saga.uid:
                return None  # deleted, and another saga took its name
            listing = await self.ledger.entries_of(current)
        except errors.NotFound:
            return None  # deleted by someone else before it was archived: its Events are all that is left
        return archived_saga(current, listing.entries)

    def done(self, uid: str, key: SagaKey, revision: int) -> None:
        self.waiting.pop(uid, None)
        self.archived[uid] = max(revision, self.archived.get(uid, 0))
        for told in self.committed:
            told(key)

    async def write_events(self) -> None:
        """Events of sagas not finished yet, written behind (the archive's row takes the rest)."""
        while True:
            await asyncio.sleep(FLUSH_SECONDS)
            events = self.events.take()
            if not events:
                continue
            try:
                await self.store.add_events(events)
            except ArchiveUnavailable:
                self.events.put_back(events)

    async def collect_if_due(self) -> None:
        if self.ttl is None:
            return
        moment = now()
        if self.collected_at is not None and moment - self.collected_at < COLLECT_EVERY:
            return
        removed = await self.store.collect(moment - self.ttl)
        self.collected_at = moment
        if removed:
            log.info("archive: %d sagas older than the archive's TTL removed", removed)

    def gauge(self) -> None:
        metrics.archive_backlog.set(len(self.waiting))
        oldest = min((w.saga.completed_at for w in self.waiting.values()), default=None)
        metrics.archive_backlog_seconds.set(0 if oldest is None else (now() - oldest).total_seconds())
