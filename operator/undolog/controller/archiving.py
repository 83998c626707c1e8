"""Every finished saga written to the archive (undolog.archive), once per revision, whole: with
every one of its entries and the Events the operator emitted about it.

Finished sagas wait in a queue drained by one task, in batches of one transaction each. While
PostgreSQL cannot be reached they wait (`undolog_archive_backlog_sagas` and `_seconds` say how
many and since when) and nothing is deleted (retention asks `holds` first); the queue drains by
itself once it can. A saga's entries come with it from its driver when it has just finished;
otherwise (found finished on taking charge, too many waiting to hold each in memory, or what
its driver held is not all of them) they are listed when its turn comes. A saga whose entries
cannot be proven all there (decisions/archive.py) is not archived, and so never deleted: it is
logged by name and counted. Events are captured as they are emitted and written behind.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from undolog import errors, metrics
from undolog.api import Resource, Saga, UndoEntry
from undolog.api.common import revision_of
from undolog.archive import ArchivedEvent, ArchivedSaga, ArchiveStore, ArchiveUnavailable, archived_saga
from undolog.archive.mend import GONE, SAGA_GONE, UNFINISHED, mend, read_whole
from undolog.controller.concurrency import woken
from undolog.controller.entry_index import SagaKey
from undolog.controller.shard_handler import ShardHandler
from undolog.conventions import now
from undolog.decisions import archive, retention
from undolog.decisions.retention import Finished
from undolog.ledger import Ledger

log = logging.getLogger("undolog.archive")
BATCH = 50  # sagas per transaction
READS_AT_ONCE = 10  # sagas of a batch read from the API at once (a GET and a LIST each) when not held
HELD = 1000  # sagas waiting with their entries in memory; past that, listed again when their turn comes
MAX_EVENTS = 100_000  # events waiting to be written while PostgreSQL is away; the oldest go past it
FLUSH_SECONDS = 1.0
# Between tries while PostgreSQL cannot be reached: each try is one refused connection, and the
# backlog drains within about a second of the server's return.
RETRY_SECONDS = (0.25, 0.5, 1.0)
SAY_AGAIN_SECONDS = 60.0  # an outage is logged when it starts, then at most this often
COLLECT_EVERY = timedelta(minutes=10)


class NotWhole(errors.UndoLogError):
    """A finished saga's entries are not all there: it is not archived (nor deleted)."""


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
        self.incomplete: dict[str, str] = {}  # saga UID -> why its entries are not all there
        self.committed: list[Callable[[SagaKey], None]] = []  # told when a saga is archived (retention)
        self.wake = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []
        self.collected_at: datetime | None = None
        self.said_away_at: float | None = None  # when the outage was last logged

    # -- what retention and the engine ask --------------------------------------------------------

    def holds(self, saga: Finished) -> bool:
        return self.archived.get(saga.uid, -1) >= (revision_of(saga.resource_version) or 0)

    def offer(self, saga: Finished, held: tuple[Saga, list[UndoEntry]] | None = None) -> None:
        """Archive this finished saga (if not archived at this revision yet). `held`: the saga
        and the entries its driver had, used if they are all of them (else they are listed)."""
        if self.holds(saga):
            return
        before = self.waiting.get(saga.uid)
        same = before is not None and before.saga.resource_version == saga.resource_version
        if same and (held is None or (before is not None and before.held is not None)):
            return  # the same copy, already waiting (with what came first: a later driver may hold less)
        if held is not None and sum(1 for w in self.waiting.values() if w.held) >= HELD:
            held = None
        self.incomplete.pop(saga.uid, None)
        self.waiting.pop(saga.uid, None)
        self.waiting[saga.uid] = Waiting(saga, held)
        self.wake.set()

    def forget(self, uid: str) -> None:
        """The saga is gone from etcd: nothing more to remember of it."""
        self.archived.pop(uid, None)
        self.incomplete.pop(uid, None)

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
        ready = False
        while True:
            try:
                if not ready:
                    await self.prepare()
                    ready = True
                if self.waiting:
                    await self.drain()
                await self.collect_if_due()
                failures = 0
                self.back()
            except ArchiveUnavailable as error:
                self.away(error)
                delay = RETRY_SECONDS[min(failures, len(RETRY_SECONDS) - 1)]
                failures += 1
                self.gauge()
                await asyncio.sleep(delay)
                continue
            self.gauge()
            if not self.waiting:
                self.wake.clear()
                await woken(self.wake, COLLECT_EVERY.total_seconds())

    async def prepare(self) -> None:
        """The schema brought up to date; then, beside the draining, what an earlier release
        wrote partially found and mended (its sagas are written again meanwhile, whole: a row
        not known whole never counts as holding a saga)."""
        version = await self.store.migrate()
        log.info("archive schema at version %d", version)
        self.tasks.append(asyncio.create_task(self.mend(), name="archive mend"))

    async def mend(self) -> None:
        while True:
            try:
                report = await mend(self.store, self.ledger)
                break
            except ArchiveUnavailable:
                await asyncio.sleep(RETRY_SECONDS[-1])
            except Exception:  # a defect: said, and `undolog archive check` does the same work
                log.exception("archive: checking the rows earlier releases wrote failed")
                return
        for found in report.mended:
            row = found.row
            say = log.error if found.outcome == SAGA_GONE else log.warning
            outcome = f"{GONE}: that history is lost" if found.outcome == SAGA_GONE else found.outcome
            say(
                "archive: the row of saga %s/%s (uid %s) lacks entries (%s); %s",
                row.namespace, row.name, row.uid, row.missing, outcome,
            )  # fmt: skip
        metrics.archive_partial_rows.set(sum(1 for f in report.mended if f.outcome == SAGA_GONE))

    def away(self, error: ArchiveUnavailable) -> None:
        moment = time.monotonic()
        if self.said_away_at is None or moment - self.said_away_at >= SAY_AGAIN_SECONDS:
            log.warning("archive: %s; %d sagas wait", error, len(self.waiting))
            self.said_away_at = moment

    def back(self) -> None:
        if self.said_away_at is not None:
            log.info("archive: reachable again; %d sagas wait", len(self.waiting))
            self.said_away_at = None

    async def drain(self) -> None:
        """One batch: what is not archived at its revision yet, read where its entries are not
        held (or not all held), READS_AT_ONCE at a time, then written with its events in one
        transaction."""
        batch = list(self.waiting.values())[:BATCH]
        known = await self.store.revisions([w.saga.uid for w in batch])
        reading = asyncio.Semaphore(READS_AT_ONCE)

        async def read(waiting: Waiting) -> ArchivedSaga | errors.KubeError | NotWhole | None:
            async with reading:
                try:
                    return await self.record_of(waiting, known.get(waiting.saga.uid))
                except (errors.KubeError, NotWhole) as error:
                    return error

        records: list[ArchivedSaga] = []
        unread = 0
        for waiting, found in zip(batch, await asyncio.gather(*(read(w) for w in batch)), strict=True):
            if isinstance(found, errors.KubeError):  # the API is away: it waits its turn again
                log.warning("archive: could not read %s: %s", waiting.saga.key, found.message)
                self.waiting[waiting.saga.uid] = self.waiting.pop(waiting.saga.uid)
                unread += 1
            elif isinstance(found, NotWhole):
                self.park(waiting.saga.uid, waiting.saga.key, str(found))
            elif found is None:
                self.waiting.pop(waiting.saga.uid, None)
            else:
                records.append(found)
        if unread == len(batch):
            await asyncio.sleep(RETRY_SECONDS[-1])
            return
        await self.write(records)

    async def write(self, records: list[ArchivedSaga]) -> None:
        events = self.events.take({r.uid for r in records})
        try:
            refused = await self.store.write(records, events)
        except ArchiveUnavailable:
            self.events.put_back(events)
            raise
        for record, why in refused:  # never reached from here (checked before): another path's defect
            metrics.archive_refused.inc()
            self.park(record.uid, record.key, f"the archive refused its row: {why}")
        gone = {r.uid for r, _ in refused}
        for record in records:
            if record.uid not in gone:
                self.done(record.uid, record.key, record.revision)
        metrics.archived_sagas.inc(len(records) - len(gone))

    async def record_of(self, waiting: Waiting, known: tuple[int, int] | None) -> ArchivedSaga | None:
        """The row to write; None when there is nothing to write (archived already, or gone).
        NotWhole when its entries cannot be proven all there."""
        saga = waiting.saga
        revision = revision_of(saga.resource_version) or 0
        if known is not None and known[0] >= revision:
            self.done(saga.uid, saga.key, known[0])
            return None
        if waiting.held is not None:
            record = archived_saga(*waiting.held)
            if archive.missing_in(record.saga, record.entries) is None:
                return record
        found = await read_whole(self.ledger, saga.namespace, saga.name, saga.uid)
        if isinstance(found, ArchivedSaga):
            return found
        if found in (GONE, UNFINISHED):
            return None  # gone (its Events are all that is left), or finishing again: offered then
        raise NotWhole(found)

    def park(self, uid: str, key: SagaKey, why: str) -> None:
        """Not archived, so kept in etcd, until its entries are all there or a person decides."""
        self.waiting.pop(uid, None)
        if self.incomplete.get(uid) != why:
            log.error(
                "archive: saga %s/%s (uid %s) is not archived, and so not deleted: %s. It is archived once its "
                "entries are all there again; to let it go without an archive, delete it by hand",
                *key,
                uid,
                why,
            )
        self.incomplete[uid] = why

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
        metrics.archive_incomplete.set(len(self.incomplete))
        oldest = min((w.saga.completed_at for w in self.waiting.values()), default=None)
        metrics.archive_backlog_seconds.set(0 if oldest is None else (now() - oldest).total_seconds())


class ArchiveFeed(ShardHandler):
    """One shard's sagas offered to the shared archive as they finish (subscribed to its informer)."""

    def __init__(self, archiver: Archiver) -> None:
        self.archiver = archiver
        self.uids: dict[SagaKey, str] = {}  # of the finished sagas offered, to forget them when gone

    def saga_seen(self, saga: Saga, *, written: bool) -> None:
        record = retention.finished(saga)
        if record is not None:
            self.uids[saga.key] = record.uid
            self.archiver.offer(record)

    def saga_gone(self, key: SagaKey) -> None:
        uid = self.uids.pop(key, None)
        if uid is not None:
            self.archiver.forget(uid)

    def saga_finished(self, saga: Saga, entries: Sequence[UndoEntry]) -> None:
        """Archived with the entries its driver held, when they are all of them."""
        record = retention.finished(saga)
        if record is not None:
            self.uids[saga.key] = record.uid
            self.archiver.offer(record, (saga, list(entries)))
