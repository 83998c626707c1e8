"""Which UndoEntry is compensated next: strictly descending stackPosition (LIFO).

An entry is still owed a compensation while its state is Pending or Running (Running means a
call may have left before a crash: it is sent again under the same key). Its effect state
hardly matters: Executing means the outcome is unknown, and unknown is compensated; only an
effect proven NotSent (no byte of the forward call left) is settled without a call, like a step
with no compensation. The operator compensates from this plan and `undolog plan` (the read
model) shows the same plan.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from undolog.api import EffectState, EntryReason, EntryState, UndoEntry

OWED = frozenset({EntryState.PENDING, EntryState.RUNNING})
SETTLED = frozenset({EntryState.COMPENSATED, EntryState.SKIPPED})
UNSETTLED = frozenset({*OWED, EntryState.FAILED})  # what a compensation still has to deal with
FAILED_EFFECTS = frozenset({EffectState.FAILED, EffectState.NOT_SENT})  # the step did not commit


def settled_without_call(entry: UndoEntry) -> tuple[EntryReason, str] | None:
    """Why an owed entry is Skipped instead of compensated, if it is: nothing to call, or
    nothing was ever done."""
    if entry.status.effect == EffectState.NOT_SENT:
        why = entry.status.last_error or "the forward call was refused before it was sent"
        return EntryReason.NOT_SENT, f"never sent, nothing to undo ({why})"[:1024]
    if entry.spec.compensation is None:
        return EntryReason.NO_COMPENSATION, "the step has no compensation (Pivot or Retriable)"
    return None


def owed(entries: Iterable[UndoEntry]) -> list[UndoEntry]:
    """Entries still owed a compensation, newest first: the order they are compensated in."""
    return newest_first(e for e in entries if e.status.state in OWED)


def unsettled(entries: Iterable[UndoEntry]) -> list[UndoEntry]:
    """Entries owed or Failed, newest first: what a retry of the saga would compensate, in order."""
    return newest_first(e for e in entries if e.status.state in UNSETTLED)


def newest_first(entries: Iterable[UndoEntry]) -> list[UndoEntry]:
    return sorted(entries, key=lambda e: e.spec.stack_position, reverse=True)


def blocking_failure(entries: Sequence[UndoEntry]) -> UndoEntry | None:
    """The highest Failed entry, which (under Halt) keeps every lower entry waiting."""
    failed = [e for e in entries if e.status.state == EntryState.FAILED]
    return max(failed, key=lambda e: e.spec.stack_position) if failed else None


def settled_count(entries: Iterable[UndoEntry]) -> int:
    """Entries compensated or skipped: the saga's compensatedCount."""
    return sum(1 for e in entries if e.status.state in SETTLED)
