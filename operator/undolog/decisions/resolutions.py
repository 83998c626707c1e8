"""Who may do what to a saga in which phase: a person's retry, skip and abort.

One set of rules for every way in: the annotations the operator consumes, the CLI, and the
dashboard. The CLI and the dashboard check them first to refuse early with the same words;
the operator checks them again when it consumes the request (it is the only writer of phases).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from undolog.api import EffectDeliveryState, EntryReason, EntryState, Saga, SagaPhase, SagaReason, UndoEntry
from undolog.conventions import RETRY_ANNOTATION, SKIP_ANNOTATION, UNDO_ANYWAY_ANNOTATION
from undolog.decisions import compensation_plan, rewind


@dataclass(frozen=True)
class Allowed:
    resume: SagaPhase  # the phase the saga goes on in


@dataclass(frozen=True)
class Refused:
    why: str


Verdict = Allowed | Refused


def halted_forward(saga: Saga) -> bool:
    """Halted going forward (after its pivot), not in a compensation."""
    return saga.status.phase == SagaPhase.HALTED and saga.status.reason == SagaReason.FORWARD_RECOVERY_EXHAUSTED


def undoing(saga: Saga) -> SagaPhase:
    """The phase a Halted saga's undoing resumes in: Rewinding when a rewind halted, else Compensating."""
    return SagaPhase.REWINDING if rewind.in_progress(saga) else SagaPhase.COMPENSATING


def retry(saga: Saga) -> Verdict:
    """A Halted saga resumes where it stopped (Failed entries go back to Pending); a Completed
    saga's failed post-commit effects are sent again."""
    phase = saga.status.phase
    if phase == SagaPhase.HALTED:
        return Allowed(SagaPhase.ACTIVE if halted_forward(saga) else undoing(saga))
    if phase == SagaPhase.COMPLETED and any(e.state == EffectDeliveryState.FAILED for e in saga.status.effects):
        return Allowed(SagaPhase.COMPLETED)
    return Refused(f"retry refused: saga {saga.metadata.name} is {phase or 'new'}, not Halted")


def skip(saga: Saga, entry: UndoEntry) -> Verdict:
    """A person says an entry needs no (more) compensation: it was undone by hand."""
    phase = saga.status.phase
    if phase == SagaPhase.HALTED and halted_forward(saga) and entry.status.effect in compensation_plan.FAILED_EFFECTS:
        return Allowed(SagaPhase.ACTIVE)
    if (
        phase == SagaPhase.HALTED
        and not halted_forward(saga)
        and entry.status.state in (EntryState.FAILED, EntryState.PENDING)
    ):
        return Allowed(undoing(saga))
    return Refused(
        f"skip of {entry.metadata.name} refused: only a Pending or Failed entry of a Halted saga can be "
        f"skipped (saga {phase or 'new'}, entry {entry.status.state})"
    )


def undo_anyway(saga: Saga, entry: UndoEntry) -> Verdict:
    """A person says an entry halted as Conflict is compensated although what its step left
    has changed since (the later change is theirs to lose)."""
    phase, status = saga.status.phase, entry.status
    if (
        phase == SagaPhase.HALTED
        and not halted_forward(saga)
        and status.state == EntryState.FAILED
        and status.reason == EntryReason.CONFLICT
    ):
        return Allowed(undoing(saga))
    return Refused(
        f"undo anyway of {entry.metadata.name} refused: only an entry of a Halted saga that failed as Conflict can be "
        f"undone anyway (saga {phase or 'new'}, entry {status.state}{f' {status.reason}' if status.reason else ''})"
    )


def abort(saga: Saga) -> Verdict:
    """An Active saga fails and is compensated, unless its pivot has committed."""
    phase = saga.status.phase
    if phase not in (None, SagaPhase.ACTIVE):
        return Refused(f"abort refused: saga {saga.metadata.name} is {phase}; only an Active saga can be aborted")
    if saga.spec.outcome is not None:
        return Refused(f"abort refused: saga {saga.metadata.name} already has spec.outcome {saga.spec.outcome}")
    if saga.status.pivot_committed:
        return Refused(
            f"abort refused: saga {saga.metadata.name}'s Pivot step has committed, so it can only go forward"
        )
    return Allowed(SagaPhase.FAILED)


def how_to_resolve(saga: Saga, entry: UndoEntry | None, *, skip: bool = True) -> str:
    """The way out of a halt, in the words of the CLI and of kubectl (both work)."""
    name, namespace = saga.metadata.name, saga.metadata.namespace
    text = (
        f"Fix the cause, then `undolog retry {name} -n {namespace} --reason <what you did>` "
        f"(or `kubectl annotate saga {name} {RETRY_ANNOTATION}=<what you did>`)"
    )
    if skip and entry is not None:
        text += (
            f", or skip the entry if it was undone by hand: `undolog skip {name} {entry.spec.stack_position} "
            f"-n {namespace} --reason <why>` "
            f'(or `kubectl annotate undo {entry.metadata.name} {SKIP_ANNOTATION}="<why>"`)'
        )
    return text


def how_to_resolve_conflict(saga: Saga, entry: UndoEntry) -> str:
    """The three ways out of a Conflict, for a person: keep the later change, lose it, or mend."""
    name, namespace, position = saga.metadata.name, saga.metadata.namespace, entry.spec.stack_position
    return (
        f"To keep the later change, skip this undo: `undolog skip {name} {position} -n {namespace} --reason <why>`; "
        f"to undo it anyway, overwriting the later change: `undolog undo-anyway {name} {position} -n {namespace} "
        f'--reason <why>` (or `kubectl annotate undo {entry.metadata.name} {UNDO_ANYWAY_ANNOTATION}="<why>"`); or set '
        f"it back by hand to what the step left, then `undolog retry {name} -n {namespace} --reason <what you did>`"
    )


def halted_on(saga: Saga, entries: Collection[UndoEntry]) -> str | None:
    """The function a Halted saga waits on: its blocking compensation's, or (halted going
    forward) its failed step's action. What a batch retry "after fixing function F" picks."""
    if saga.status.phase != SagaPhase.HALTED:
        return None
    if halted_forward(saga):
        steps = saga.spec.steps or []
        failed = [
            e
            for e in entries
            if e.status.effect in compensation_plan.FAILED_EFFECTS and e.status.state != EntryState.SKIPPED
        ]
        positions = [e.spec.stack_position for e in failed if 0 < e.spec.stack_position <= len(steps)]
        return steps[max(positions) - 1].action.function if positions else None
    failure = compensation_plan.blocking_failure(entries)
    if failure is None or failure.spec.compensation is None:
        return None
    return failure.spec.compensation.function
