"""One saga's driver: decide, apply, repeat until the decision is to wait.

Woken by watch events (the saga's or its entries'), by a deadline, or after a failure with
backoff. It holds no state that matters across restarts: everything it acts on is read from
the API, and every write is conditional on what it read. What it keeps between reconciles is
how far its entries are proven complete (entry_proof), which a new driver starts without. The
moves are applied by `applying`; entries lost or not owned are reported by `entry_losses`.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

from undolog import errors
from undolog.api import EventReason, LostEntry, Saga, SagaPhase, SagaReason, UndoEntry
from undolog.controller import applying
from undolog.controller.applying.compensation import IN_FLIGHT_DELETION
from undolog.controller.applying.turn import Turn
from undolog.controller.concurrency import woken
from undolog.controller.context import DriverContext, Slot
from undolog.controller.entry_losses import EntryLosses
from undolog.controller.entry_proof import EntryProver, Listed
from undolog.controller.saga_copy import SagaCopy
from undolog.controller.saga_status import StatusWriter
from undolog.conventions import owned_by
from undolog.decisions import moves, phases
from undolog.decisions.lost_entries import lost_entry
from undolog.decisions.retry import operator_retry_seconds
from undolog.decisions.stack import Stack

log = logging.getLogger("undolog.driver")
NOT_LEADING_RECHECK = 1.0  # seconds before a driver that found the Lease in doubt looks again
MAX_UNEXPECTED_TEXT = 1024  # of an unexpected error's text in an Event (its traceback goes to the log)


class SagaDriver:
    # One per saga that needs work (10,000 when as many resume): no per-instance dict.
    __slots__ = (
        "context",
        "copy",
        "gone",
        "last_error",
        "losses",
        "name",
        "namespace",
        "never_sent",
        "prover",
        "quit_gone",
        "status",
        "task",
        "wake",
    )

    def __init__(self, context: DriverContext, namespace: str, name: str, *, resting: bool = True) -> None:
        """`resting`: it waits behind others for a slot (its copy held as JSON meanwhile)."""
        self.context = context
        self.namespace, self.name = namespace, name
        self.copy = SagaCopy(resting=resting)  # the newest copy of the saga seen
        self.gone = False
        self.quit_gone = False  # it stopped because its saga was gone (a saga seen again after that needs another)
        self.wake = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.last_error: str | None = None
        self.prover = EntryProver(context, namespace, name)
        self.status = StatusWriter(context, namespace, self.prover)
        self.losses = EntryLosses(context, self.key, self.status, self.wake)
        self.never_sent: set[str] = set()  # entries this driver created and has not yet sent

    @property
    def key(self) -> tuple[str, str]:
        return self.namespace, self.name

    @property
    def latest(self) -> Saga | None:
        return self.copy.saga

    @latest.setter
    def latest(self, saga: Saga | None) -> None:
        self.copy.saga = saga

    @property
    def seen_saga(self) -> bool:
        return self.copy.seen

    @property
    def listed(self) -> Listed | None:
        return self.prover.listed

    @listed.setter
    def listed(self, listed: Listed | None) -> None:
        self.prover.listed = listed

    def lose(self, lost: LostEntry) -> None:
        self.losses.lose(lost)

    def vanish(self, entry: UndoEntry) -> None:
        self.losses.vanish(entry)

    def notify(self, saga: Saga | None) -> None:
        """The saga as a watch saw it; None: deleted. A saga relabelled out of its shard's watch
        reaches it as DELETED and comes back once filed: it is not gone after all (the driver
        that quit meanwhile left it undriven for good)."""
        self.gone = saga is None
        if saga is not None:
            self.copy.keep_newest(saga)
        self.wake.set()

    async def run(self, slot: Slot | None = None) -> None:
        """Reconcile until the saga needs nothing more; `slot`: one already taken for the first
        reconcile (its drivers start one once a slot is free)."""
        failures = 0
        while not self.gone:
            self.wake.clear()
            try:
                async with slot or Slot(self.context.slots, self.namespace):
                    slot = None
                    self.copy.rest(False)
                    wait = await self.reconcile()
                failures, self.last_error = 0, None
            except errors.NotFound as missing:
                if not names_other_than_saga(missing):
                    return  # the saga was deleted: nothing of ours is left to hold
                failures += 1  # an entry deleted meanwhile: said, and decided again
                wait = self._backoff(failures, missing)
            except errors.Conflict as conflict:  # someone wrote first: read again and decide again
                log.info("saga %s/%s: %s; deciding again", self.namespace, self.name, conflict.message)
                self.latest = None
                continue
            except errors.NotLeading:
                # This operator cannot be sure it still holds the Lease (a late renewal under
                # load): wait and look again. If it did lose it, every driver of the shard is stopped;
                # a driver that quit on its own would leave its saga to no one.
                wait = moves.Wait(until=self.context.clock.now() + timedelta(seconds=NOT_LEADING_RECHECK))
            except Exception as error:
                # The API's errors, a stale entry, and also a defect or input nobody foresaw: said
                # on the saga and retried with backoff. A driver task that ended with one would
                # leave its saga where it stood, with nothing in `kubectl describe` or the log.
                failures += 1
                wait = self._backoff(failures, error)
            if wait.finished and not self.wake.is_set():
                return
            timeout = None if wait.until is None else max((wait.until - self.context.clock.now()).total_seconds(), 0.0)
            self.copy.rest(not self.wake.is_set() or self.context.slots.locked())  # woken already: no pause
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
        return moves.Wait(until=self.context.clock.now() + timedelta(seconds=delay))

    async def reconcile(self) -> moves.Wait:
        saga = self.latest or await self.context.ledger.saga(self.namespace, self.name)
        # Entries of an earlier saga with the same name, not yet collected, are not ours.
        entries = Stack(e for e in self.context.index.of(self.key).values() if owned_by(e, saga.metadata.uid))
        self.prover.aged()
        while True:
            saga = await self.losses.report(saga, entries)  # noticed meanwhile: never decide on a stale copy
            move = phases.decide(saga, entries, self.context.clock.now(), self.prover.proof)
            log.debug("saga %s/%s: %s", self.namespace, self.name, type(move).__name__)
            if isinstance(move, moves.Wait):
                self.copy.keep_newest(saga)
                if move.finished:
                    self.context.informer.finished(saga, list(entries))
                return move
            self.context.fence.check()
            written = await self.applied(move, saga, entries)
            if isinstance(move, applying.CALLS):
                self.prover.aged()
            # An event may have brought a newer copy while the write was in flight.
            newer = self.copy.keep_newest(written)
            if newer is None:
                newer = self.latest = await self.context.ledger.saga(self.namespace, self.name)
            saga = newer

    async def applied(self, move: moves.Move, saga: Saga, entries: Stack) -> Saga:
        """The saga as the move left it; what the API answered that the move cannot undo is
        dealt with here (an entry deleted meanwhile, a write refused, a conflict)."""
        turn = Turn(self.context, self.status, self.prover, self.losses, self.never_sent, saga, entries)
        try:
            return await applying.apply(turn, move)
        except errors.NotFound as missing:
            entry = getattr(move, "entry", None)
            why = IN_FLIGHT_DELETION
            if entry is None:  # one of the entries a move writes (a retry puts them back to Pending)
                entry, why = deleted_entry(missing, entries), "deleted by hand"
            if entry is None:
                raise
            # The entry was deleted while the move wrote it: report it, go on.
            entries.pop(entry.metadata.name)
            self.lose(lost_entry(entry, why))
            return saga
        except errors.Invalid as refused:
            return await self.refused(move, saga, entries, refused)
        except errors.Conflict:
            # Someone else wrote the entry (beyond what can be replayed): decide again on its
            # newest copy, not on what the watch may still hold.
            entry = getattr(move, "entry", None)
            if entry is not None:
                self.context.index.keep(await self.context.ledger.entry(*entry.key))
            raise
        finally:
            # What the move wrote is the newest copy, kept even when a later write of the move
            # failed: decided again on the watch's older copy, an entry compensated a moment
            # before was called again as attempt 1 (seen at 1,000 sagas, a saga write's 409).
            for entry in entries.taken_changed():
                self.context.index.keep(entry)

    async def refused(self, move: moves.Move, saga: Saga, entries: Stack, refused: errors.Invalid) -> Saga:
        """The API refused a write this move needs, and would refuse it again: never retried
        forever. A step that cannot be registered fails the saga (what ran is compensated);
        anything else halts it for a person, with the API's own message."""
        if isinstance(move, moves.RegisterStep):
            message = f"step {move.step.name!r} could not be registered: {refused.message}"
            failed = moves.Transition(SagaPhase.FAILED, SagaReason.STEP_NOT_REGISTERED, message, move.step.name)
            return await self.status.enter(saga, entries, failed)
        message = f"the API refused a write the operator needs ({type(move).__name__}): {refused.message}"
        halted = moves.Transition(SagaPhase.HALTED, SagaReason.LEDGER_WRITE_REFUSED, message[:4096])
        return await self.status.enter(saga, entries, halted)


def deleted_entry(missing: errors.NotFound, entries: Stack) -> UndoEntry | None:
    """The entry of `entries` the 404 names (the apiserver's Status details); None: something
    else (the saga itself, when deleted)."""
    details = missing.details
    if details is None or details.kind != "undoentries":
        return None
    return next((e for e in entries if e.metadata.name == details.name), None)


def names_other_than_saga(missing: errors.NotFound) -> bool:
    """Whether the 404 is about another object than the saga (its Status names what is missing):
    a driver that took an entry's 404 for its saga's stopped, and left a person's retry unanswered."""
    return missing.details is not None and missing.details.kind not in ("", "sagas")
