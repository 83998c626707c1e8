"""Moves that write the saga's own record: its phase, labels and finalizer, depth, pivot, the
refusals said on it, and the proof of its entries."""

from __future__ import annotations

import asyncio

from undolog.api import EventReason, Saga, SagaPhase, SagaReason
from undolog.api.changes import changed, with_status
from undolog.controller.applying.compensation import enter_compensating
from undolog.controller.applying.turn import Turn
from undolog.decisions import moves, phases

STARTED = moves.Transition(SagaPhase.ACTIVE, SagaReason.STARTED, "the operator took charge")


async def initialize(turn: Turn, _: moves.Initialize) -> Saga:
    return await turn.status.enter(turn.saga, turn.entries, STARTED)


async def transition(turn: Turn, move: moves.Transition) -> Saga:
    """Enter the phase; a compensation's first call leaves beside the write (enter_compensating)."""
    saga, entries = turn.saga, turn.entries
    status = turn.status.entering(saga, entries, move)
    entered = with_status(saga, status)
    following = phases.decide(entered, entries, turn.context.clock.now(), turn.prover.proof)
    if isinstance(following, moves.CompensateEntries):
        return await enter_compensating(turn, entered, move.phase, move.reason, following)
    return await turn.status.entered(saga, status, move.phase, move.reason)


async def sync_metadata(turn: Turn, move: moves.SyncMetadata) -> Saga:
    saga, ledger = turn.saga, turn.context.ledger
    # The entries' field owners go first (after the release nothing comes back); written with the
    # object, an entry's status write dropped them already.
    if move.entries_too and ledger.entry_route.subresource:
        for entry in await asyncio.gather(*(ledger.forget_entry_owners(e) for e in turn.entries)):
            turn.entries.put(entry)
    synced = await ledger.write_saga_metadata(
        saga, labels=move.labels, finalizers=move.finalizers, forget_owners=move.final
    )
    turn.prover.relisted(saga, synced)
    return synced


async def update_depth(turn: Turn, move: moves.UpdateDepth) -> Saga:
    return await turn.status.write(turn.saga, changed(turn.saga.status, {"stack_depth": move.stack_depth}))


async def prove_entries(turn: Turn, _: moves.ProveEntries) -> Saga:
    for lost in await turn.prover.prove(turn.saga, turn.entries):
        turn.losses.lose(lost)
    return turn.saga


async def refuse_rewind(turn: Turn, move: moves.RefuseRewind) -> Saga:
    saga, refused = turn.saga, move.rewind
    turn.context.timeline.record(saga, EventReason.REWIND_REFUSED, refused.message or "rewind refused", warning=True)
    return await turn.status.write(saga, changed(saga.status, {"rewind": refused}))


async def mark_pivot(turn: Turn, _: moves.MarkPivot) -> Saga:
    saga = turn.saga
    turn.context.timeline.record(
        saga, EventReason.PIVOT_COMMITTED, "the Pivot step committed: the saga only goes forward now"
    )
    return await turn.status.write(saga, changed(saga.status, {"pivot_committed": True}))


async def refuse_abort(turn: Turn, move: moves.RefuseAbort) -> Saga:
    saga = turn.saga
    turn.context.timeline.record(saga, EventReason.ABORT_REFUSED, move.message, warning=True)
    status = changed(saga.status, {"reason": SagaReason.ABORT_REFUSED, "message": move.message})
    return await turn.status.write(saga, status)
