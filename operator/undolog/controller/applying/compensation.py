"""Moves that settle entries: compensating them (the first call beside the phase's write) and
settling an entry registered after its saga committed."""

from __future__ import annotations

from undolog import errors
from undolog.api import EntryReason, EntryState, EventReason, Saga, SagaPhase, SagaReason
from undolog.api.changes import changed
from undolog.controller.applying.turn import Turn
from undolog.controller.concurrency import beside, raise_first
from undolog.decisions import moves
from undolog.decisions.lost_entries import lost_entry

IN_FLIGHT_DELETION = "deleted by hand while its call was in flight"


async def compensate_entries(turn: Turn, move: moves.CompensateEntries) -> Saga:
    await compensate(turn, turn.saga, [e.metadata.name for e in move.entries])
    return await turn.status.counted(turn.saga, turn.entries)


async def compensate(turn: Turn, saga: Saga, names: list[str]) -> None:
    """Compensate entries together; what each one wrote is kept even when another raised."""
    compensator, ledger, entries = turn.context.compensator, turn.context.ledger, turn.entries

    async def one(name: str) -> None:
        try:
            entries.put(await compensator.compensate(saga, entries[name], turn.outputs))
        except errors.NotFound:  # deleted while its call was being made: report it, go on
            turn.losses.lose(lost_entry(entries[name], IN_FLIGHT_DELETION))
            entries.pop(name)
        except (errors.Conflict, errors.NotLeading):
            # Decide again on its newest copy, not on what the watch holds: a call cut off when
            # the Lease fell in doubt may have marked the entry Running first, and an older copy
            # made the next try's writes conflict and its call go out once more as attempt 1
            # (seen at 1,000 sagas, with late renewals).
            turn.context.index.keep(await ledger.entry(*entries[name].key))
            raise

    if names:  # LIFO owes one at a time; independent entries go together
        raise_first(await beside(one(names[0]), *(one(name) for name in names[1:])))


async def enter_compensating(
    turn: Turn, entered: Saga, phase: SagaPhase, reason: SagaReason, first: moves.CompensateEntries
) -> Saga:
    """The new phase is written while its first compensation is already on the wire: the
    write took an fsync (~10 ms, more under load) on the way from an abort to the first call.
    The call may leave before the phase is recorded because nothing depends on that order:
    after a crash, or a conflict on the write, the failure is decided again from the API
    and the same entry is called under the same key (or found Compensated)."""
    names = [e.metadata.name for e in first.entries]
    # Dated now, before the call leaves: its outcome may be recorded before this write returns,
    # and `kubectl describe` must still read Failed first (seen the other way round).
    writing = turn.status.entered(turn.saga, entered.status, phase, reason, at=turn.context.clock.now())
    compensated, written = await beside(compensate(turn, entered, names), writing)
    turn.prover.aged()  # a call was made since the listing
    raise_first([written, compensated])  # the write's failure first: it says more
    assert isinstance(written, Saga)
    return written


async def record_late_entry(turn: Turn, move: moves.RecordLateEntry) -> Saga:
    saga, entry = turn.saga, move.entry
    why = (
        f"registered after saga {saga.metadata.name} was Completed: a committed saga is never compensated, "
        "so nothing will undo this step's effect"
    )
    settled = changed(
        entry.status,
        {"state": EntryState.SKIPPED, "reason": EntryReason.REGISTERED_AFTER_COMPLETION, "skip_reason": why},
    )
    turn.entries.put(await turn.context.ledger.write_entry_status(entry, settled))
    turn.context.timeline.record(
        saga,
        EventReason.ENTRY_AFTER_COMPLETION,
        f"{entry.metadata.name} (step {entry.spec.step}) {why}",
        warning=True,
    )
    return saga
