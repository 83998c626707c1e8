"""The named changes of an UndoEntry's status that more than one part of the operator makes:
each the one definition of that transition (the ledger writes it conditionally)."""

from __future__ import annotations

from datetime import datetime

from undolog.api import EffectState, EntryReason, EntryState, UndoEntryStatus
from undolog.api.changes import EntryStatusChange
from undolog.decisions import compensation_plan, guards


def skipped(reason: EntryReason, why: str, *, rewound_at: datetime | None = None) -> EntryStatusChange:
    """Settled without a call: nothing to call, nothing was done, a person skipped it, or it
    came after its saga committed. `rewound_at`: settled by a rewind, history from then on."""
    change: EntryStatusChange = {"state": EntryState.SKIPPED, "reason": reason, "skip_reason": why}
    if rewound_at is not None:
        change["rewound_at"] = rewound_at
    return change


def compensated(at: datetime, *, rewinding: bool) -> EntryStatusChange:
    """Undone, by its compensation or natively (an object's undo); settled while its saga
    rewinds, history from then on."""
    change: EntryStatusChange = {"state": EntryState.COMPENSATED, "compensated_at": at, "reason": None}
    if rewinding:
        change["rewound_at"] = at
    return change


def undone_anyway(status: UndoEntryStatus, why: str) -> EntryStatusChange:
    """A person's undo anyway of a Conflict: owed again, its guard not asked (and why, on it)."""
    return {
        "state": EntryState.PENDING,
        "retry_count": 0,
        "reason": None,
        "guard": guards.overridden(status.guard, why),
    }


def not_acted_on(reason: EntryReason, why: str) -> EntryStatusChange:
    """The operator will not act on the entry (not its saga's own, no such saga): why, on it."""
    return {"reason": reason, "last_error": why}


def retried(status: UndoEntryStatus, resume_forward: bool) -> EntryStatusChange | None:
    """A person's retry: a failed step's effect Pending again (forward recovery), or a Failed
    compensation Pending again with its retries counted anew; None when the retry leaves it be."""
    if resume_forward:
        failed = status.effect in compensation_plan.FAILED_EFFECTS and status.state != EntryState.SKIPPED
        return {"effect": EffectState.PENDING, "reason": None} if failed else None
    if status.state == EntryState.FAILED:
        return {"state": EntryState.PENDING, "retry_count": 0, "reason": None}
    return None
