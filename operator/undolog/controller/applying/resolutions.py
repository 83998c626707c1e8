"""Moves a person asked for: a retry of the saga, a skip of an entry, or the refusal of an
annotation that does not apply now (decisions/resolutions.py decides which)."""

from __future__ import annotations

from undolog.api import (
    EffectDeliveryState,
    EntryReason,
    EventReason,
    Saga,
    SagaPhase,
    SagaReason,
)
from undolog.api.changes import changed, with_status
from undolog.controller.applying.turn import Turn
from undolog.conventions import RETRY_ANNOTATION, SKIP_ANNOTATION, UNDO_ANYWAY_ANNOTATION
from undolog.decisions import entry_changes, moves


async def retry(turn: Turn, move: moves.Retry) -> Saga:
    """What failed goes back to Pending, and the saga resumes."""
    saga, entries, ledger = turn.saga, turn.entries, turn.context.ledger
    message = f"retry requested: {move.request}"
    if move.resume == SagaPhase.COMPLETED:
        effects = [
            changed(e, {"state": EffectDeliveryState.PENDING}) if e.state == EffectDeliveryState.FAILED else e
            for e in saga.status.effects
        ]
        status = changed(saga.status, {"effects": effects, "reason": SagaReason.RETRY_REQUESTED, "message": message})
        saga = await turn.status.write(saga, status)
    else:
        for entry in list(entries):
            again = entry_changes.retried(entry.status, resume_forward=move.resume == SagaPhase.ACTIVE)
            if again is not None:
                entries.put(await ledger.write_entry_status(entry, changed(entry.status, again)))
        # Retrying says the person dealt with the lost entries: the saga goes on without them.
        acknowledged = [changed(e, {"acknowledged": True}) for e in saga.status.lost_entries]
        saga = with_status(saga, changed(saga.status, {"lost_entries": acknowledged}))
        saga = await turn.status.enter(
            saga, entries, moves.Transition(move.resume, SagaReason.RETRY_REQUESTED, message)
        )
    return await ledger.drop_annotation(saga, RETRY_ANNOTATION)


async def skip_entry(turn: Turn, move: moves.SkipEntry) -> Saga:
    saga, entries, ledger = turn.saga, turn.entries, turn.context.ledger
    name, reason = move.entry.metadata.name, move.reason
    # Settled by the rewind, if one is under way: history from now on.
    rewound_at = turn.context.clock.now() if move.resume == SagaPhase.REWINDING else None
    changes = entry_changes.skipped(EntryReason.SKIPPED_BY_PERSON, reason, rewound_at=rewound_at)
    written = await ledger.write_entry_status(entries[name], changed(entries[name].status, changes))
    entries.put(await ledger.drop_annotation(written, SKIP_ANNOTATION))
    turn.context.timeline.record(entries[name], EventReason.SKIPPED, f"skipped by a person: {reason}", warning=True)
    resumed = moves.Transition(move.resume, SagaReason.ENTRY_SKIPPED, f"{name} skipped: {reason}")
    return await turn.status.enter(saga, entries, resumed)


async def undo_anyway(turn: Turn, move: moves.UndoAnyway) -> Saga:
    saga, entries, ledger = turn.saga, turn.entries, turn.context.ledger
    name, reason = move.entry.metadata.name, move.reason
    written = await ledger.write_entry_status(
        entries[name], changed(entries[name].status, entry_changes.undone_anyway(entries[name].status, reason))
    )
    entries.put(await ledger.drop_annotation(written, UNDO_ANYWAY_ANNOTATION))
    said = f"undo anyway, overwriting what changed since the step: {reason}"
    turn.context.timeline.record(entries[name], EventReason.UNDO_ANYWAY, said, warning=True)
    resumed = moves.Transition(move.resume, SagaReason.RETRY_REQUESTED, f"{name} undone anyway: {reason}")
    return await turn.status.enter(saga, entries, resumed)


async def refuse_annotation(turn: Turn, move: moves.RefuseAnnotation) -> Saga:
    saga, ledger = turn.saga, turn.context.ledger
    turn.context.timeline.record(saga, EventReason.ANNOTATION_IGNORED, move.message, warning=True)
    if move.entry is None:
        return await ledger.drop_annotation(saga, move.key)
    turn.entries.put(await ledger.drop_annotation(turn.entries[move.entry.metadata.name], move.key))
    return saga
