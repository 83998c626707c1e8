"""Rewind (partial rollback): undo the entries above `spec.rewind.toPosition`, in the
dependency order, then hand the saga back Active so the agent (or the operator, for an
orchestrated saga) goes on from there. Pure: the saga and its entries in, a decision out.

A request is pending while `status.rewind` does not answer it (same toPosition and reason), so
the same request is never carried out twice, and a new one must differ. The compensated entries
stay in the ledger as history (`status.rewoundAt`); new steps get new, higher stack positions.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from undolog.api import Rewind, RewindState, RewindStatus, Saga, SagaPhase, StepType, UndoEntry


def position_of(step_or_position: str | int, entries: Iterable[UndoEntry]) -> int:
    """The stack position to rewind to: a position as given, or the position of a step's
    current run (that step is kept; everything after it is undone)."""
    if isinstance(step_or_position, int):
        return step_or_position
    entry = current(entries).get(step_or_position)
    if entry is None:
        raise ValueError(f"no step {step_or_position!r} has run in this saga (or it was rewound already)")
    return entry.spec.stack_position


def may_request(saga: Saga, request: Rewind) -> str | None:
    """Why a rewind cannot be asked for now (it is only for an Active saga), or None."""
    if saga.status.phase != SagaPhase.ACTIVE:
        return f"rewind refused: saga {saga.metadata.name} is {saga.status.phase or 'new'}, not Active"
    return refusal(saga, request)


def outcome(saga: Saga, request: Rewind) -> RewindStatus | None:
    """The rewind's final record once it has been carried out or refused; None while pending."""
    last = saga.status.rewind
    if last is None or not last.answers(request) or last.state == RewindState.REWINDING:
        return None
    return last


def requested(saga: Saga) -> Rewind | None:
    """The rewind asked for in spec.rewind and not carried out (nor refused) yet."""
    request, last = saga.spec.rewind, saga.status.rewind
    if request is None or (last is not None and last.answers(request)):
        return None
    return request


def in_progress(saga: Saga) -> bool:
    """A rewind was started and not finished: a retry or skip of its halt resumes it."""
    last = saga.status.rewind
    return last is not None and last.state == RewindState.REWINDING


def pivot_position(saga: Saga) -> tuple[int, str] | None:
    """The position and name of an orchestrated saga's committed Pivot step."""
    if not saga.status.pivot_committed:
        return None
    for position, step in enumerate(saga.spec.steps or [], start=1):
        if step.type == StepType.PIVOT:
            return position, step.name
    return None


def refusal(saga: Saga, request: Rewind) -> str | None:
    """Why this rewind cannot be carried out, or None."""
    if saga.spec.outcome is not None:
        return f"rewind refused: spec.outcome is {saga.spec.outcome}, the saga is ending"
    pivot = pivot_position(saga)
    if pivot is not None and request.to_position < pivot[0]:
        return (
            f"rewind to {request.to_position} refused: it would undo the committed Pivot step {pivot[1]!r} "
            f"(position {pivot[0]}); rewind to {pivot[0]} or above"
        )
    return None


def started(request: Rewind, now: datetime) -> RewindStatus:
    return RewindStatus(
        to_position=request.to_position, reason=request.reason, state=RewindState.REWINDING, started_at=now
    )


def refused(request: Rewind, message: str) -> RewindStatus:
    return RewindStatus(
        to_position=request.to_position, reason=request.reason, state=RewindState.REFUSED, message=message
    )


def undone_by(saga: Saga, entries: Iterable[UndoEntry]) -> list[UndoEntry]:
    """The entries the rewind in progress deals with: every entry above its position not
    settled by a rewind (those are history, this one's included)."""
    last = saga.status.rewind
    if last is None:
        return []
    return [e for e in entries if e.spec.stack_position > last.to_position and e.status.rewound_at is None]


def current(entries: Iterable[UndoEntry]) -> dict[str, UndoEntry]:
    """Each step's entry that counts now: its newest one not undone by a rewind."""
    by_step: dict[str, UndoEntry] = {}
    for entry in sorted(entries, key=lambda e: e.spec.stack_position):
        if entry.status.rewound_at is None:
            by_step[entry.spec.step] = entry
    return by_step


def outputs(entries: Iterable[UndoEntry]) -> dict[str, dict[str, Any] | None]:
    """What `${steps.<name>.output...}` refers to: each step's current output."""
    return {step: entry.status.output for step, entry in current(entries).items()}
