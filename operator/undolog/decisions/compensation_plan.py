"""Which UndoEntry is compensated next: strictly descending stackPosition (LIFO).

An entry is still owed a compensation while its state is Pending or Running (Running means a
call may have left before a crash: it is sent again under the same key). Its effect state does
not matter: Executing means the outcome is unknown, and unknown is compensated. The operator
compensates from this plan and `undolog plan` (the read model) shows the same plan.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from undolog.api import EntryState, UndoEntry

OWED = frozenset({EntryState.PENDING, EntryState.RUNNING})
SETTLED = frozenset({EntryState.COMPENSATED, EntryState.SKIPPED})
UNSETTLED = frozenset({*OWED, EntryState.FAILED})  # what a compensation still has to deal with


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
