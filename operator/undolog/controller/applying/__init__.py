"""Applying the moves the state machine decides (decisions/moves.py): one small applier per
kind of move, found in APPLIERS. A new kind of move is one function here and one line below."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from undolog.api import Saga
from undolog.controller.applying import compensation, forward, phase, resolutions
from undolog.controller.applying.turn import Turn
from undolog.decisions import moves

Applier = Callable[[Turn, Any], Awaitable[Saga]]  # (the turn, its move) -> the saga as written

APPLIERS: dict[type, Applier] = {
    moves.Initialize: phase.initialize,
    moves.SyncMetadata: phase.sync_metadata,
    moves.UpdateDepth: phase.update_depth,
    moves.Transition: phase.transition,
    moves.ProveEntries: phase.prove_entries,
    moves.RefuseRewind: phase.refuse_rewind,
    moves.MarkPivot: phase.mark_pivot,
    moves.RefuseAbort: phase.refuse_abort,
    moves.RegisterStep: forward.register_step,
    moves.ExecuteStep: forward.execute_step,
    moves.DeliverEffect: forward.deliver_effect,
    moves.CompensateEntries: compensation.compensate_entries,
    moves.RecordLateEntry: compensation.record_late_entry,
    moves.Retry: resolutions.retry,
    moves.SkipEntry: resolutions.skip_entry,
    moves.UndoAnyway: resolutions.undo_anyway,
    moves.RefuseAnnotation: resolutions.refuse_annotation,
}
CALLS = (moves.CompensateEntries, moves.ExecuteStep, moves.DeliverEffect)  # moves that take time


async def apply(turn: Turn, move: moves.Move) -> Saga:
    """Apply `move` (never Wait: the driver stops there) with one write, one read or one call."""
    return await APPLIERS[type(move)](turn, move)
