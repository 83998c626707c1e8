"""One saga's driver: decide, apply, repeat until the decision is to wait.

Woken by watch events (the saga's or its entries'), by a deadline, or after a failure with
backoff. It holds no state that matters across restarts: everything it acts on is read from
the API, and every write is conditional on what it read. What it keeps between reconciles is
how far its entries are proven complete (a consistent LIST since the saga failed), which a
new driver starts without.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Collection, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from undolog import errors, metrics
from undolog.api import (
    MAX_LOST_ENTRIES,
    EffectDeliveryState,
    EffectState,
    EffectStatus,
    EntryReason,
    EntryState,
    EventReason,
    LostEntry,
    RewindStatus,
    Saga,
    SagaPhase,
    SagaReason,
    SagaStatus,
    UndoEntry,
)
from undolog.controller.context import DriverContext, Slot
from undolog.conventions import RETRY_ANNOTATION, SKIP_ANNOTATION, not_owned_why, now, owned_by
from undolog.decisions import compensation_plan, lost_entries, moves, phases, retention
from undolog.decisions.moves import EntryProof
from undolog.decisions.retry import operator_retry_seconds
from undolog.decisions.stack import Stack
from undolog.kube.watch import Progress
from undolog.ledger import EntryListing

log = logging.getLogger("undolog.driver")
TOOK_CHARGE = "the operator took charge"
COUNTER_INTERVAL = 5.0  # seconds between progress writes of stackDepth and compensatedCount
NOT_LEADING_RECHECK = 1.0  # seconds before a driver that found the Lease in doubt looks again
MAX_UNEXPECTED_TEXT = 1024  # of an unexpected error's text in an Event (its traceback goes to the log)
WATCH_PROOF_WAIT = 5.0  # seconds a proof waits for the entry watch before it lists instead
CALLS = (moves.CompensateEntries, moves.ExecuteStep, moves.DeliverEffect)  # moves that take time
Entries = Stack


@dataclass(frozen=True, slots=True)
class Listed:
    """A saga's copy as the engine listed it on taking charge (its resourceVersion), and when
    that listing was sent: the entry listing taken just after proves what the copy showed by then."""

    resource_version: str
    at: datetime


class ProofSource(StrEnum):
    """Where a proof that a saga's entries are all known came from (`prove`)."""

    TAKING_CHARGE = "TakingCharge"
    WATCH = "Watch"
    WRITE_ECHO = "WriteEcho"
    LIST = "List"


# Listings a proof no longer needs, held until they finish (a task nobody holds may be collected).
_UNREAD: set[asyncio.Future[EntryListing]] = set()


def _left_unread(listing: asyncio.Future[EntryListing]) -> None:
    _UNREAD.discard(listing)
    if not listing.cancelled():
        listing.exception()  # retrieved: an error nobody waits for is not one to log


def lost_entry(entry: UndoEntry, why: str) -> LostEntry:
    call = entry.spec.compensation
    return LostEntry(
        name=entry.metadata.name,
        stack_position=entry.spec.stack_position,
        step=entry.spec.step,
        function=call.function if call else None,
        why=why[:1024],
    )


async def woken(wake: asyncio.Event, seconds: float | None) -> None:
    """Until `wake` is set or `seconds` pass (None: no limit). Never `asyncio.wait_for`: on Python 3.11 it
    returns normally when cancelled just as the event is set, and a driver that swallowed its
    cancellation kept looping, so stopping the engine never ended (seen at 10,000 sagas)."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await wake.wait()


async def beside(first: Awaitable[Any], *others: Awaitable[Any]) -> list[Any]:
    """Every outcome, exceptions as values: `first` run in this task, `others` as tasks beside
    it, waited for all the same when `first` raises, and cancelled with it. A task starts on the
    event loop's next turn, milliseconds later with sagas failing together: what must leave at
    once goes first."""
    tasks = [asyncio.ensure_future(other) for other in others]
    try:
        try:
            outcome = await first
        except Exception as error:
            outcome = error
        return [outcome, *await asyncio.gather(*tasks, return_exceptions=True)]
    finally:
        for task in tasks:
            task.cancel()  # nothing when they are over


def raise_first(outcomes: list[Any]) -> None:
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome


class SagaDriver:
    # One per saga that needs work (10,000 when as many resume): no per-instance dict.
    __slots__ = (
        "_latest",
        "_shrunk",
        "context",
        "gone",
        "last_error",
        "last_status_write",
        "listed",
        "lost",
        "name",
        "namespace",
        "never_sent",
        "proof",
        "quit_gone",
        "task",
        "vanished",
        "wake",
        "working",
    )

    def __init__(self, context: DriverContext, namespace: str, name: str) -> None:
        self.context = context
        self.namespace, self.name = namespace, name
        # The newest copy of the saga seen: parsed while the driver reconciles (in its slot);
        # otherwise as its revision and JSON (~2 KiB against ~10 KiB parsed: 10,000 drivers
        # wait for a slot when as many sagas resume).
        self._latest: Saga | None = None
        self._shrunk: tuple[int | None, str] | None = None
        self.working = False  # reconciling, in its slot
        self.gone = False
        self.quit_gone = False  # it stopped because its saga was gone (a saga seen again after that needs another)
        self.wake = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.last_status_write = 0.0
        self.last_error: str | None = None
        self.lost: list[LostEntry] = []  # entries gone since the last reconcile, to be reported
        # Entries a watch saw deleted, read again before they are reported lost: one relabelled
        # out of a shard's watch reaches that watch as DELETED though it still exists, and its
        # saga halted with an entry "deleted by hand" that was not.
        self.vanished: list[UndoEntry] = []
        self.proof = EntryProof.NONE
        self.never_sent: set[str] = set()  # entries this driver created and has not yet sent
        self.listed: Listed | None = None  # on taking charge, just before the entries were listed

    @property
    def key(self) -> tuple[str, str]:
        return self.namespace, self.name

    @property
    def latest(self) -> Saga | None:
        if self._shrunk is not None:
            return Saga.model_validate_json(self._shrunk[1])
        return self._latest

    @latest.setter
    def latest(self, saga: Saga | None) -> None:
        if saga is None or self.working:
            self._latest, self._shrunk = saga, None
        else:
            self._latest, self._shrunk = None, (saga.metadata.revision, saga.model_dump_json(by_alias=True))

    @property
    def seen_saga(self) -> bool:
        return self._latest is not None or self._shrunk is not None

    def _working(self, working: bool) -> None:
        """In its slot the saga is held parsed; out of it, as JSON."""
        saga = self.latest
        self.working = working
        self.latest = saga

    def keep_newest(self, saga: Saga) -> Saga | None:
        """Hold the newer of `saga` and the copy held, and return it; None when the two cannot be
        ordered (ledger.newest): then it is read again."""
        if self._shrunk is not None:
            held = self._shrunk[0]
        elif self._latest is not None:
            held = self._latest.metadata.revision
        else:
            self.latest = saga
            return saga
        revision = saga.metadata.revision
        if held is None or revision is None:
            self._latest = self._shrunk = None
            return None
        if held > revision:
            return self.latest
        if held < revision:
            self.latest = saga
        return saga  # the newer, or the same copy (a write's own echo)

    def lose(self, lost: LostEntry) -> None:
        """An entry can no longer be compensated: record it on the saga at the next reconcile."""
        self.lost.append(lost)
        self.wake.set()

    def vanish(self, entry: UndoEntry) -> None:
        """A watch saw the entry deleted: lost if it is gone when read again."""
        self.vanished.append(entry)
        self.wake.set()

    async def confirm_vanished(self, saga: Saga, entries: Entries) -> None:
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

    def notify(self, saga: Saga | None) -> None:
        """The saga as a watch saw it; None: deleted. A saga relabelled out of its shard's watch
        reaches it as DELETED and comes back once filed: it is not gone after all (the driver
        that quit meanwhile left it undriven for good)."""
        self.gone = saga is None
        if saga is not None:
            self.keep_newest(saga)
        self.wake.set()

    async def run(self, slot: Slot | None = None) -> None:
        """Reconcile until the saga needs nothing more; `slot`: one already taken for the first
        reconcile (the engine starts a driver once a slot is free)."""
        failures = 0
        while not self.gone:
            self.wake.clear()
            try:
                async with slot or Slot(self.context.slots, self.namespace):
                    slot = None
                    self._working(True)
                    try:
                        wait = await self.reconcile()
                    finally:
                        self._working(False)
                failures, self.last_error = 0, None
            except errors.NotFound:
                return  # the saga was deleted: nothing of ours is left to hold
            except errors.Conflict as conflict:  # someone wrote first: read again and decide again
                log.info("saga %s/%s: %s; deciding again", self.namespace, self.name, conflict.message)
                self.latest = None
                continue
            except errors.NotLeading:
                # This operator cannot be sure it still holds the Lease (a late renewal under
                # load): wait and look again. If it did lose it, the engine stops every driver;
                # a driver that quit on its own would leave its saga to no one.
                wait = moves.Wait(until=now() + timedelta(seconds=NOT_LEADING_RECHECK))
            except Exception as error:
                # The API's errors, a stale entry, and also a defect or input nobody foresaw: said
                # on the saga and retried with backoff. A driver task that ended with one would
                # leave its saga where it stood, with nothing in `kubectl describe` or the log.
                failures += 1
                wait = self._backoff(failures, error)
            if wait.finished and not self.wake.is_set():
                return
            timeout = None if wait.until is None else max((wait.until - now()).total_seconds(), 0.0)
            await woken(self.wake, timeout)
        self.quit_gone = True

    def _backoff(self, failures: int, error: Exception) -> moves.Wait:
        delay = operator_retry_seconds(failures)
        if isinstance(error, errors.KubeError):
            text = error.message
        elif isinstance(error, errors.UndoLogError):
            text = str(error)
        else:
            text = f"unexpected {type(error).__name__} in the operator: {error}"[:MAX_UNEXPECTED_TEXT]
        traceback = error if not isinstance(error, errors.UndoLogError) and text != self.last_error else None
        log.error("saga %s/%s: %s; retrying in %.0f s", self.namespace, self.name, text, delay, exc_info=traceback)
        if text != self.last_error and self.latest is not None:  # say it once, not at every retry
            self.context.timeline.record(
                self.latest, EventReason.OPERATOR_ERROR, f"{text}; retrying with backoff", warning=True
            )
        self.last_error = text
        return moves.Wait(until=now() + timedelta(seconds=delay))

    async def reconcile(self) -> moves.Wait:
        ledger, index = self.context.ledger, self.context.index
        saga = self.latest or await ledger.saga(self.namespace, self.name)
        # Entries of an earlier saga with the same name, not yet collected, are not ours.
        entries = Stack(e for e in index.of(self.key).values() if owned_by(e, saga.metadata.uid))
        if self.proof == EntryProof.FRESH:
            self.proof = EntryProof.STALE  # time passed since the listing: something may have come
        while True:
            if self.vanished:
                await self.confirm_vanished(saga, entries)
            if self.lost:  # noticed by the watch meanwhile: never compensate from a stale copy
                for lost in self.lost:
                    entries.pop(lost.name)
                saga = await self.report_lost(saga)
            saga = await self.report_unowned(saga, entries)
            move = phases.decide(saga, entries, now(), self.proof)
            log.debug("saga %s/%s: %s", self.namespace, self.name, type(move).__name__)
            if isinstance(move, moves.Wait):
                self.keep_newest(saga)
                if move.finished:
                    self.context.finished(saga, list(entries))
                return move
            self.context.fence.check()
            try:
                written = await self.apply(move, saga, entries)
            except errors.NotFound:
                entry = getattr(move, "entry", None)
                if entry is None:
                    raise
                # The entry was deleted while its call was being made: report it, go on.
                entries.pop(entry.metadata.name)
                self.lose(lost_entry(entry, "deleted by hand while its call was in flight"))
                written = saga
            except errors.Invalid as refused:
                written = await self.refused(move, saga, entries, refused)
            except errors.Conflict:
                # Someone else wrote the entry (beyond what can be replayed): decide again on its
                # newest copy, not on what the watch may still hold.
                entry = getattr(move, "entry", None)
                if entry is not None:
                    self.context.index.keep(await ledger.entry(*entry.key))
                raise
            finally:
                # What the move wrote is the newest copy, kept even when a later write of the move
                # failed: decided again on the watch's older copy, an entry compensated a moment
                # before was called again as attempt 1 (seen at 1,000 sagas, a saga write's 409).
                for entry in entries.taken_changed():
                    index.keep(entry)
            if isinstance(move, CALLS) and self.proof == EntryProof.FRESH:
                self.proof = EntryProof.STALE
            # An event may have brought a newer copy while the write was in flight.
            newer = self.keep_newest(written)
            if newer is None:
                newer = self.latest = await ledger.saga(self.namespace, self.name)
            saga = newer

    async def compensate(
        self, saga: Saga, entries: Entries, names: list[str], outputs: Mapping[str, Mapping[str, Any] | None]
    ) -> None:
        """Compensate entries together; what each one wrote is kept even when another raised."""
        compensator, ledger = self.context.compensator, self.context.ledger

        async def one(name: str) -> None:
            try:
                entries.put(await compensator.compensate(saga, entries[name], outputs))
            except errors.NotFound:  # deleted while its call was being made: report it, go on
                self.lose(lost_entry(entries[name], "deleted by hand while its call was in flight"))
                entries.pop(name)
            except (errors.Conflict, errors.NotLeading):
                # Decide again on its newest copy, not on what the watch holds: a call cut off when
                # the Lease fell in doubt may have marked the entry Running first, and an older copy
                # made the next try's writes conflict and its call go out once more as attempt 1
                # (seen at 1,000 sagas, with late renewals).
                self.context.index.keep(await ledger.entry(*entries[name].key))
                raise

        if names:  # LIFO owes one at a time; independent entries go together
            raise_first(await beside(one(names[0]), *(one(name) for name in names[1:])))

    async def prove(self, saga: Saga, entries: Entries) -> None:
        """The proof that none of the saga's entries is missing, from the cheapest source that
        gives it (a LIST scans every entry of the namespace in the apiserver: one per saga made
        resuming 10,000 sagas quadratic):
        - for the saga's copy listed on taking charge: the entry listing taken just after it;
        - after calls: the entry watch, once it has applied its stream up to the saga's newest
          entry write (made after the last call), which is as good as a LIST taken then;
        - else a consistent LIST of the saga's entries, raced with the entry watch's echo of
          the next entry write sent from now on, any saga's (ledger.EntryWrites): with sagas
          failing together the LISTs wait up to 100 ms for the apiserver's cache, while another
          saga's call outcome is written in ~10. What the index held and the listing lacks was
          deleted; what cannot be read is reported."""
        listed = self.listed
        if (
            self.proof == EntryProof.NONE
            and listed is not None
            and saga.metadata.resource_version == listed.resource_version
            and phases.proof_due_by(saga, listed.at)
        ):
            metrics.series.of(metrics.entry_proofs, self.namespace, ProofSource.TAKING_CHARGE).inc()
            self.proof = EntryProof.STALE
            return
        if self.proof == EntryProof.STALE and await self.watched_past(entries):
            metrics.series.of(metrics.entry_proofs, self.namespace, ProofSource.WATCH).inc()
            self.take_indexed(saga, entries)
            return
        ledger = self.context.ledger
        progress = self.context.entries_seen(self.namespace)
        mark = ledger.entry_writes.mark()
        listing = asyncio.ensure_future(ledger.entries_of(saga))
        if progress is not None and await self.echoed_before(listing, progress, mark):
            metrics.series.of(metrics.entry_proofs, self.namespace, ProofSource.WRITE_ECHO).inc()
            self.take_indexed(saga, entries)
            return
        metrics.series.of(metrics.entry_proofs, self.namespace, ProofSource.LIST).inc()
        answer = await listing
        for gone in self.context.index.replace(self.key, answer.entries + answer.unowned):
            if owned_by(gone, saga.metadata.uid) and gone.status.state not in compensation_plan.SETTLED:
                self.lose(lost_entry(gone, "deleted by hand"))
        for unreadable in answer.unreadable:
            self.lose(unreadable.lost)
        entries.replace(answer.entries)
        self.proof = EntryProof.FRESH

    def take_indexed(self, saga: Saga, entries: Entries) -> None:
        """The saga's entries as the index holds them, proven complete by the watch."""
        held = self.context.index.of(self.key)
        entries.replace(e for e in held.values() if owned_by(e, saga.metadata.uid))
        self.proof = EntryProof.FRESH

    async def echoed_before(self, listing: asyncio.Future[EntryListing], progress: Progress, mark: int) -> bool:
        """Whether the entry watch applies an entry write of the namespace sent after `mark`
        before `listing` answers. The listing is then left to finish unread: cancelled, its
        connection to the apiserver would be closed and opened again."""

        async def echoed() -> bool:
            revision = await self.context.ledger.entry_writes.next_after(mark, self.namespace)
            return await progress.reached(revision, WATCH_PROOF_WAIT)

        echo = asyncio.ensure_future(echoed())
        try:
            await asyncio.wait((listing, echo), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            listing.cancel()
            raise
        finally:
            echo.cancel()
        if not (echo.done() and not echo.cancelled() and echo.result()):
            return False
        _UNREAD.add(listing)
        listing.add_done_callback(_left_unread)
        return True

    async def watched_past(self, entries: Entries) -> bool:
        """Whether the watch of every entry of the namespace reaches the newest write of these
        entries within WATCH_PROOF_WAIT (deletions and unreadable entries up to there have then
        been reported to this driver too)."""
        progress = self.context.entries_seen(self.namespace)
        revisions = [e.metadata.revision for e in entries]
        if progress is None or not revisions:
            return False
        known = [r for r in revisions if r is not None]
        return len(known) == len(revisions) and await progress.reached(max(known), WATCH_PROOF_WAIT)

    async def refused(self, move: moves.Move, saga: Saga, entries: Entries, refused: errors.Invalid) -> Saga:
        """The API refused a write this move needs, and would refuse it again: never retried
        forever. A step that cannot be registered fails the saga (what ran is compensated);
        anything else halts it for a person, with the API's own message."""
        if isinstance(move, moves.RegisterStep):
            message = f"step {move.step.name!r} could not be registered: {refused.message}"
            return await self.enter(
                saga, entries, SagaPhase.FAILED, SagaReason.STEP_NOT_REGISTERED, message, failed_step=move.step.name
            )
        message = f"the API refused a write the operator needs ({type(move).__name__}): {refused.message}"
        return await self.enter(saga, entries, SagaPhase.HALTED, SagaReason.LEDGER_WRITE_REFUSED, message[:4096])

    # -- applying moves ----------------------------------------------------------------------

    async def apply(self, move: moves.Move, saga: Saga, entries: Entries) -> Saga:
        context = self.context
        ledger, timeline = context.ledger, context.timeline
        outputs = entries.outputs()
        match move:
            case moves.Initialize():
                return await self.enter(saga, entries, SagaPhase.ACTIVE, SagaReason.STARTED, TOOK_CHARGE)
            case moves.SyncMetadata(labels=labels, finalizers=finalizers, final=final, entries_too=entries_too):
                if entries_too:  # the entries' field owners go first: after the release nothing comes back
                    for entry in await asyncio.gather(*(ledger.forget_entry_owners(e) for e in entries)):
                        entries.put(entry)
                synced = await ledger.write_saga_metadata(
                    saga, labels=labels, finalizers=finalizers, forget_owners=final
                )
                if self.listed is not None and self.listed.resource_version == saga.metadata.resource_version:
                    # Written conditionally on the listed copy, its labels and finalizers only:
                    # the new copy shows what the listed one did, and the listing proves it still.
                    self.listed = Listed(synced.metadata.resource_version, self.listed.at)
                return synced
            case moves.UpdateDepth(stack_depth=depth):
                return await self.write_status(saga, saga.status.model_copy(update={"stack_depth": depth}))
            case moves.ProveEntries():
                await self.prove(saga, entries)
                return saga
            case moves.Transition(phase=phase, reason=reason, message=message, failed_step=failed_step, rewind=rewound):
                status = self.entering(saga, entries, phase, reason, message, failed_step=failed_step, rewound=rewound)
                entered = saga.model_copy(update={"status": status})
                following = phases.decide(entered, entries, now(), self.proof)
                if isinstance(following, moves.CompensateEntries):
                    return await self.enter_compensating(saga, entered, phase, reason, entries, following, outputs)
                return await self.entered(saga, status, phase, reason)
            case moves.RefuseRewind(rewind=refused):
                timeline.record(saga, EventReason.REWIND_REFUSED, refused.message or "rewind refused", warning=True)
                return await self.write_status(saga, saga.status.model_copy(update={"rewind": refused}))
            case moves.RegisterStep(position=position, step=step, again=again):
                entry, created = await context.forwarder.register(saga, position, step, again=again)
                entries.put(entry)
                if created:
                    self.never_sent.add(entry.metadata.name)
                return await self.counted(saga, entries)
            case moves.ExecuteStep(entry=entry, step=step):
                name = entry.metadata.name
                first_send = name in self.never_sent
                self.never_sent.discard(name)  # from here on an attempt may have left
                sending = context.forwarder.execute(saga, entries[name], step, outputs, first_send=first_send)
                if saga.status.phase is None:
                    sent, saga = await self.active_if_slow(saga, entries, sending)
                    entries.put(sent)
                else:
                    entries.put(await sending)
                return await self.counted(saga, entries)
            case moves.MarkPivot():
                timeline.record(
                    saga, EventReason.PIVOT_COMMITTED, "the Pivot step committed: the saga only goes forward now"
                )
                return await self.write_status(saga, saga.status.model_copy(update={"pivot_committed": True}))
            case moves.RefuseAbort(message=message):
                timeline.record(saga, EventReason.ABORT_REFUSED, message, warning=True)
                status = saga.status.model_copy(update={"reason": SagaReason.ABORT_REFUSED, "message": message})
                return await self.write_status(saga, status)
            case moves.CompensateEntries(entries=owed):
                await self.compensate(saga, entries, [e.metadata.name for e in owed], outputs)
                return await self.counted(saga, entries)
            case moves.DeliverEffect(effect=effect):
                delivered = await context.forwarder.deliver(saga, effect, outputs)
                return await self.write_status(saga, _with_effect(saga.status, delivered))
            case moves.Retry(request=request, resume=resume):
                return await self.retry(saga, entries, request, resume)
            case moves.SkipEntry(entry=entry, reason=reason, resume=resume):
                name = entry.metadata.name
                changes: dict[str, Any] = {
                    "state": EntryState.SKIPPED,
                    "skip_reason": reason,
                    "reason": EntryReason.SKIPPED_BY_PERSON,
                }
                if resume == SagaPhase.REWINDING:  # settled by the rewind: history from now on
                    changes["rewound_at"] = now()
                skipped = entries[name].status.model_copy(update=changes)
                written = await ledger.write_entry_status(entries[name], skipped)
                entries.put(await ledger.drop_annotation(written, SKIP_ANNOTATION))
                timeline.record(entries[name], EventReason.SKIPPED, f"skipped by a person: {reason}", warning=True)
                return await self.enter(saga, entries, resume, SagaReason.ENTRY_SKIPPED, f"{name} skipped: {reason}")
            case moves.RefuseAnnotation(entry=entry, key=key, message=message):
                timeline.record(saga, EventReason.ANNOTATION_IGNORED, message, warning=True)
                if entry is None:
                    return await ledger.drop_annotation(saga, key)
                entries.put(await ledger.drop_annotation(entries[entry.metadata.name], key))
                return saga
            case moves.RecordLateEntry(entry=entry):
                return await self.record_late(saga, entries, entry)
        raise AssertionError(f"unhandled move {move!r}")

    async def record_late(self, saga: Saga, entries: Entries, entry: UndoEntry) -> Saga:
        why = (
            f"registered after saga {saga.metadata.name} was Completed: a committed saga is never compensated, "
            "so nothing will undo this step's effect"
        )
        settled = entry.status.model_copy(
            update={"state": EntryState.SKIPPED, "reason": EntryReason.REGISTERED_AFTER_COMPLETION, "skip_reason": why}
        )
        entries.put(await self.context.ledger.write_entry_status(entry, settled))
        self.context.timeline.record(
            saga,
            EventReason.ENTRY_AFTER_COMPLETION,
            f"{entry.metadata.name} (step {entry.spec.step}) {why}",
            warning=True,
        )
        return saga

    async def report_lost(self, saga: Saga) -> Saga:
        """Record the entries lost since the last report on the saga. They are let go only once
        written: a write lost to another writer (409) left the saga compensated as though they
        had never been."""
        known = {e.name for e in saga.status.lost_entries}
        new = [e for e in self.lost if e.name not in known]
        if new:
            listed, omitted = lost_entries.recorded(saga.status.lost_entries, saga.status.lost_entries_omitted, new)
            status = saga.status.model_copy(update={"lost_entries": listed, "lost_entries_omitted": omitted})
            saga = await self.write_status(saga, status)
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

    async def report_unowned(self, saga: Saga, entries: Entries) -> Saga:
        """Entries that name the saga but are not its own (conventions.owned_by): each says why,
        on itself and in an Event, once; the saga names them (status.unownedEntries)."""
        ledger, uid = self.context.ledger, saga.metadata.uid
        if self.context.index.count(self.key) == len(entries) and not saga.status.unowned_entries:
            return saga  # every entry held is one of its own (the common case, at no cost per entry)
        unowned = [e for e in self.context.index.of(self.key).values() if not owned_by(e, uid)]
        if sorted(e.metadata.name for e in unowned) != saga.status.unowned_entries:
            # The index may hold only some (a finished saga's entries are let go): a listing tells.
            unowned = (await ledger.entries_of(saga)).unowned
        for entry in unowned:
            if entry.status.reason == EntryReason.NOT_OWNED_BY_SAGA:
                continue
            why = not_owned_why(entry, self.name, uid)
            try:
                self.context.index.keep(await ledger.mark_not_owned(entry, why))
            except errors.NotFound:
                continue
            self.context.timeline.record(entry, EventReason.ENTRY_NOT_OWNED, why, warning=True)
        names = sorted(e.metadata.name for e in unowned)[:MAX_LOST_ENTRIES]
        if names == saga.status.unowned_entries:
            return saga
        new = sorted(set(names) - set(saga.status.unowned_entries))
        saga = await self.write_status(saga, saga.status.model_copy(update={"unowned_entries": names}))
        if new:
            self.context.timeline.record(
                saga,
                EventReason.ENTRY_NOT_OWNED,
                f"{', '.join(new)} name this saga but are not its own (ownerReferences): never compensated as its"
                " steps; see each entry's status.lastError",
                warning=True,
            )
        return saga

    async def retry(self, saga: Saga, entries: Entries, request: str, resume: SagaPhase) -> Saga:
        """A person's retry: what failed goes back to Pending, and the saga resumes."""
        ledger = self.context.ledger
        if resume == SagaPhase.COMPLETED:
            effects = [
                e.model_copy(update={"state": EffectDeliveryState.PENDING})
                if e.state == EffectDeliveryState.FAILED
                else e
                for e in saga.status.effects
            ]
            status = saga.status.model_copy(
                update={
                    "effects": effects,
                    "reason": SagaReason.RETRY_REQUESTED,
                    "message": f"retry requested: {request}",
                }
            )
            saga = await self.write_status(saga, status)
        else:
            for entry in list(entries):
                was = entry.status
                if (
                    resume == SagaPhase.ACTIVE
                    and was.effect in compensation_plan.FAILED_EFFECTS
                    and was.state != EntryState.SKIPPED
                ):
                    again = was.model_copy(update={"effect": EffectState.PENDING, "reason": None})
                elif resume in (SagaPhase.COMPENSATING, SagaPhase.REWINDING) and was.state == EntryState.FAILED:
                    again = was.model_copy(update={"state": EntryState.PENDING, "retry_count": 0, "reason": None})
                else:
                    continue
                entries.put(await ledger.write_entry_status(entry, again))
            # Retrying says the person dealt with the lost entries: the saga goes on without them.
            acknowledged = [e.model_copy(update={"acknowledged": True}) for e in saga.status.lost_entries]
            saga = saga.model_copy(update={"status": saga.status.model_copy(update={"lost_entries": acknowledged})})
            saga = await self.enter(saga, entries, resume, SagaReason.RETRY_REQUESTED, f"retry requested: {request}")
        return await ledger.drop_annotation(saga, RETRY_ANNOTATION)

    async def enter(
        self,
        saga: Saga,
        entries: Entries,
        phase: SagaPhase,
        reason: SagaReason,
        message: str,
        *,
        failed_step: str | None = None,
        rewound: RewindStatus | None = None,
    ) -> Saga:
        """Enter a new phase: its status (conditions, counters) written, then its Event."""
        status = self.entering(saga, entries, phase, reason, message, failed_step=failed_step, rewound=rewound)
        return await self.entered(saga, status, phase, reason)

    def entering(
        self,
        saga: Saga,
        entries: Entries,
        phase: SagaPhase,
        reason: SagaReason,
        message: str,
        *,
        failed_step: str | None = None,
        rewound: RewindStatus | None = None,
    ) -> SagaStatus:
        """The saga's status in its new phase."""
        before = saga.status
        if before.phase is None and phase != SagaPhase.ACTIVE:  # its steps ran before Active was written
            before = before.model_copy(update={"start_time": saga.metadata.creation_timestamp})
        moment = now()
        status = phases.with_phase(
            before,
            phase,
            reason=reason,
            message=message,
            now=moment,
            generation=saga.metadata.generation,
            expires_at=retention.expires_at(saga, phase, moment, self.context.retention),
        )
        status = _with_counters(status, entries)
        if failed_step:
            status = status.model_copy(update={"failed_step": failed_step})
        if rewound is not None:
            status = status.model_copy(update={"rewind": rewound})
        if phase == SagaPhase.COMPLETED and not saga.spec.steps:
            # The proven top of the stack at the commit: an entry above it came later.
            top = max((e.spec.stack_position for e in entries), default=0)
            status = status.model_copy(update={"top_position": top})
        if phase == SagaPhase.ACTIVE:
            self.proof = EntryProof.NONE  # a new failure needs a new proof
        return status

    async def entered(
        self, saga: Saga, status: SagaStatus, phase: SagaPhase, reason: SagaReason, *, at: datetime | None = None
    ) -> Saga:
        """Write the new phase's status (from `entering`), then post the Event (dated `at`, when
        the phase was entered, if not now)."""
        written = await self.write_status(saga, status)
        metrics.series.of(metrics.saga_transitions, self.namespace, phase, reason).inc()
        self.context.phase_changed(written)
        failed = reason in phases.FAILURE_REASONS  # the failure shares this write: say it as such
        warning = failed or phase in (SagaPhase.FAILED, SagaPhase.HALTED)
        self.context.timeline.record(
            written, SagaPhase.FAILED if failed else phase, f"{reason}: {status.message}", warning=warning, at=at
        )
        return written

    async def enter_compensating(
        self,
        saga: Saga,
        entered: Saga,
        phase: SagaPhase,
        reason: SagaReason,
        entries: Entries,
        first: moves.CompensateEntries,
        outputs: Mapping[str, Mapping[str, Any] | None],
    ) -> Saga:
        """The new phase is written while its first compensation is already on the wire: the
        write took an fsync (~10 ms, more under load) on the way from an abort to the first call.
        The call may leave before the phase is recorded because nothing depends on that order:
        after a crash, or a conflict on the write, the failure is decided again from the API
        and the same entry is called under the same key (or found Compensated)."""
        names = [e.metadata.name for e in first.entries]
        # Dated now, before the call leaves: its outcome may be recorded before this write returns,
        # and `kubectl describe` must still read Failed first (seen the other way round).
        writing = self.entered(saga, entered.status, phase, reason, at=now())
        compensated, written = await beside(self.compensate(entered, entries, names, outputs), writing)
        if self.proof == EntryProof.FRESH:
            self.proof = EntryProof.STALE  # a call was made since the listing
        raise_first([written, compensated])  # the write's failure first: it says more
        assert isinstance(written, Saga)
        return written

    async def active_if_slow(
        self, saga: Saga, entries: Entries, sending: Awaitable[UndoEntry]
    ) -> tuple[UndoEntry, Saga]:
        """A step sent before the saga's Active status was written (phases.steps_before_active):
        should its call outlast the moment, Active is written meanwhile, so that a saga never
        shows no phase for as long as a slow participant takes."""
        call = asyncio.ensure_future(sending)
        try:
            created = saga.metadata.creation_timestamp or now()
            moment = (created + phases.ACTIVE_WRITE_AFTER - now()).total_seconds()
            done, _ = await asyncio.wait({call}, timeout=max(moment, 0.0))
            if not done:
                try:
                    saga = await self.enter(saga, entries, SagaPhase.ACTIVE, SagaReason.STARTED, TOOK_CHARGE)
                except errors.KubeError as error:  # the next decision writes Active instead
                    log.info("saga %s/%s: Active not written yet: %s", self.namespace, self.name, error.message)
            return await call, saga
        finally:
            call.cancel()  # nothing when the call is over; a driver stopped takes its call with it

    async def counted(self, saga: Saga, entries: Entries) -> Saga:
        """Refresh stackDepth and compensatedCount after an entry moved, at most once per
        COUNTER_INTERVAL: fast sagas show their counts with the next phase, slow ones show
        progress (STEPS and UNDONE in `kubectl get sagas`) while they run. A saga whose steps
        run before its first phase is written gets its counts with that phase. Not while every
        slot is taken: the operator is at its limit then (thousands of sagas resuming, each
        slow only because it shares the apiserver with the others), and a progress write per
        saga slowed them all."""
        if (
            saga.status.phase is None
            or time.monotonic() - self.last_status_write < COUNTER_INTERVAL
            or self.context.slots.locked()
        ):
            return saga
        status = _with_counters(saga.status, entries)
        if status == saga.status:
            return saga
        return await self.write_status(saga, status)

    async def write_status(self, saga: Saga, status: SagaStatus) -> Saga:
        written = await self.context.ledger.write_saga_status(saga, status)
        self.last_status_write = time.monotonic()
        return written


def _with_counters(status: SagaStatus, entries: Collection[UndoEntry]) -> SagaStatus:
    return status.model_copy(
        update={"stack_depth": len(entries), "compensated_count": compensation_plan.settled_count(entries)}
    )


def _with_effect(status: SagaStatus, delivered: EffectStatus) -> SagaStatus:
    previous = next((e for e in status.effects if e.name == delivered.name), None)
    if previous is not None:
        delivered = delivered.model_copy(update={"attempts": previous.attempts + delivered.attempts})
    effects = [e for e in status.effects if e.name != delivered.name] + [delivered]
    return status.model_copy(update={"effects": effects})
