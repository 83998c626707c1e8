"""Which UndoEntry is compensated next: strictly descending stackPosition.

An entry is still owed a compensation while its state is Pending or Running (Running means a
call may have left before a crash: it is sent again under the same key). Its effect state does
not matter: Executing means the outcome is unknown, and unknown is compensated.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from undolog.api.undo_entry import UndoEntry

OWED = frozenset({"Pending", "Running"})
SETTLED = frozenset({"Compensated", "Skipped"})


def plan(entries: Iterable[UndoEntry]) -> list[UndoEntry]:
    """Entries still owed a compensation, newest first."""
    return sorted(
        (e for e in entries if e.status.state in OWED),
        key=lambda e: e.spec.stack_position,
        reverse=True,
    )


def blocking_failure(entries: Sequence[UndoEntry]) -> UndoEntry | None:
    """The highest Failed entry, which (under Halt) keeps every lower entry waiting."""
    failed = [e for e in entries if e.status.state == "Failed"]
    return max(failed, key=lambda e: e.spec.stack_position) if failed else None


def settled_count(entries: Iterable[UndoEntry]) -> int:
    """Entries compensated or skipped: the saga's compensatedCount."""
    return sum(1 for e in entries if e.status.state in SETTLED)
