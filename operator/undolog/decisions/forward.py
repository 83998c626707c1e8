"""Orchestrated sagas going forward: which step to register or send next, and the post-commit
effects of a completed saga. Pure: the saga and its entries in, a move out.

Steps run in order, one at a time. A step's entry is created before its call (register before
execute); an entry whose effect is Pending or Executing is sent (again) under the same key.
Before the pivot commits, a failure fails the saga and everything registered is compensated;
after it, Retriable steps are retried until they succeed, and a failure halts the saga.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime

from undolog.api import (
    EffectDeliveryState,
    EffectState,
    EntryState,
    Outcome,
    Saga,
    SagaPhase,
    SagaReason,
    Step,
    StepType,
    UndoEntry,
)
from undolog.decisions import compensation_plan, rewind
from undolog.decisions.arguments import referenced_steps
from undolog.decisions.moves import (
    DeliverEffect,
    ExecuteStep,
    MarkPivot,
    Move,
    RefuseAbort,
    RegisterStep,
    Transition,
)
from undolog.decisions.resolutions import how_to_resolve
from undolog.errors import UnresolvedReference

FORWARD_RECOVERY_RETRIES = 30  # a Retriable step's retries unless its Call says otherwise
EFFECT_RETRIES = 30


def reference_problems(steps: Sequence[Step]) -> list[str]:
    """Every reference that names an unknown step or a step that has not run before the call."""
    problems = []
    names = [s.name for s in steps]
    for index, step in enumerate(steps):
        calls = [("action", step.action)] + ([("compensation", step.compensation)] if step.compensation else [])
        for part, call in calls:
            try:
                referred = referenced_steps(call.args)
            except UnresolvedReference as error:
                problems.append(f"step {step.name!r} {part}: {error}")
                continue
            # An action may use earlier steps' outputs; a compensation also its own step's.
            visible = names[: index + 1] if part == "compensation" else names[:index]
            for name in referred:
                if name not in names:
                    problems.append(f"step {step.name!r} {part} refers to ${{steps.{name}...}}: there is no such step")
                elif name not in visible:
                    problems.append(
                        f"step {step.name!r} {part} refers to ${{steps.{name}...}}, which has not run before it: "
                        "a call can only use the outputs of steps before it"
                    )
    return problems


def pivot_committed(steps: Sequence[Step], entries: Collection[UndoEntry]) -> bool:
    by_step = rewind.current(entries)
    for step in steps:
        if step.type == StepType.PIVOT:
            entry = by_step.get(step.name)
            return entry is not None and entry.status.effect == EffectState.COMMITTED
    return False


def forward_move(saga: Saga, entries: Collection[UndoEntry], now: datetime, deadline: datetime | None) -> Move:
    steps = saga.spec.steps or []
    meta, status = saga.metadata, saga.status
    committed_pivot = pivot_committed(steps, entries)
    if saga.spec.outcome == Outcome.ABORT:
        if not committed_pivot:
            return Transition(SagaPhase.FAILED, SagaReason.ABORTED, "spec.outcome is Abort")
        if status.reason != SagaReason.ABORT_REFUSED:
            return RefuseAbort(
                "abort refused: the Pivot step has committed, so the saga can only go forward; "
                "its Retriable steps run until they succeed"
            )
    if not committed_pivot:
        if meta.deletion_timestamp is not None:
            return Transition(
                SagaPhase.FAILED, SagaReason.DELETED, "the saga was deleted while Active; its effects are undone first"
            )
        if deadline is not None and now >= deadline:
            return Transition(
                SagaPhase.FAILED,
                SagaReason.DEADLINE_EXCEEDED,
                f"not finished within spec.activeDeadlineSeconds={saga.spec.active_deadline_seconds}",
            )
    problems = reference_problems(steps)
    if problems:
        return Transition(SagaPhase.FAILED, SagaReason.INVALID_REFERENCE, "; ".join(problems))
    if committed_pivot and not status.pivot_committed:
        return MarkPivot()
    by_step = rewind.current(entries)  # after a rewind, the steps above it run again
    for step in steps:
        entry = by_step.get(step.name)
        if entry is None:
            top = max((e.spec.stack_position for e in entries), default=0)
            return RegisterStep(top + 1, step, again=any(e.spec.step == step.name for e in entries))
        effect = entry.status.effect
        if effect in (EffectState.PENDING, EffectState.EXECUTING):
            return ExecuteStep(entry, step)
        if effect in compensation_plan.FAILED_EFFECTS and entry.status.state != EntryState.SKIPPED:
            error = entry.status.last_error or "unknown error"
            if step.type == StepType.RETRIABLE:
                return Transition(
                    SagaPhase.HALTED,
                    SagaReason.FORWARD_RECOVERY_EXHAUSTED,
                    f"Retriable step {step.name!r} ({step.action.function} {step.action.version}) did not succeed: "
                    f"{error}. The pivot has committed, so nothing is compensated. {how_to_resolve(saga, entry)}",
                    failed_step=step.name,
                )
            return Transition(
                SagaPhase.FAILED, SagaReason.STEP_FAILED, f"step {step.name!r} failed: {error}", failed_step=step.name
            )
    return Transition(SagaPhase.COMPLETED, SagaReason.COMMITTED, f"all {len(steps)} steps committed")


def effects_move(saga: Saga) -> DeliverEffect | None:
    """The first post-commit effect not yet delivered (nor given up on)."""
    done = {e.name for e in saga.status.effects if e.state != EffectDeliveryState.PENDING}
    for effect in saga.spec.effects or []:
        if effect.name not in done:
            return DeliverEffect(effect)
    return None
