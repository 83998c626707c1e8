"""The saga state machine: given a saga and its entries, the next move.

Active -> Completed, or Active -> Failed -> Compensating -> Compensated | Halted.
`decide` is pure: the controller applies the move it returns (one API write or one call),
then asks again with what the write returned, until the answer is to wait.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from undolog.api.common import Condition, ConditionStatus
from undolog.api.saga import Saga, SagaPhase, SagaStatus
from undolog.api.undo_entry import UndoEntry
from undolog.decisions import lifo
from undolog.decisions.forward import effects_move, forward_move
from undolog.decisions.moves import (
    CompensateEntry,
    Initialize,
    Move,
    RefuseAnnotation,
    Retry,
    SkipEntry,
    SyncMetadata,
    Transition,
    UpdateDepth,
    Wait,
)

FINALIZER = "undolog.io/compensate-before-delete"
PHASE_LABEL = "undolog.io/phase"
ORG_LABEL = "undolog.io/org"
RETRY_ANNOTATION = "undolog.io/retry"
SKIP_ANNOTATION = "undolog.io/skip"
ABORT_REASON_ANNOTATION = "undolog.io/abort-reason"  # why the agent or person aborted (SDK, CLI)
FAILED_STEP_ANNOTATION = "undolog.io/failed-step"  # the step whose failure made the agent abort
TERMINAL: frozenset[SagaPhase] = frozenset({"Completed", "Compensated"})
QUICK = (Transition, UpdateDepth, Initialize)  # status writes that happen in milliseconds


def decide(saga: Saga, entries: Sequence[UndoEntry], now: datetime) -> Move:
    meta = saga.metadata
    if saga.status.phase is None:
        # The finalizer first: from the moment the saga is Active, deleting it compensates it.
        # The same write labels it active, one write early rather than one write more.
        if FINALIZER not in meta.finalizers and meta.deletion_timestamp is None:
            labels = {k: v for k, v in desired_labels(saga, "Active").items() if meta.labels.get(k) != v}
            return SyncMetadata(labels, [*meta.finalizers, FINALIZER])
        return Initialize()
    annotation = annotation_move(saga, entries)
    if annotation is not None:
        return annotation
    move = phase_move(saga, entries, now)
    # Labels and finalizer follow the phase, but not through phases passed in a few
    # milliseconds: they are written before anything slow (a call, waiting).
    if isinstance(move, QUICK):
        return move
    return metadata_move(saga) or move


def phase_move(saga: Saga, entries: Sequence[UndoEntry], now: datetime) -> Move:
    phase = saga.status.phase
    if phase == "Active":
        if saga.spec.steps:
            return forward_move(saga, entries, now, deadline_of(saga))
        return external_move(saga, entries, now)
    if phase == "Failed":
        return Transition("Compensating", "Compensating", f"undoing {len(lifo.plan(entries))} entries newest-first")
    if phase == "Compensating":
        return compensating_move(saga, entries)
    if phase == "Compensated" and lifo.plan(entries) and not saga.spec.steps:
        late = lifo.plan(entries)[0]
        return Transition("Compensating", "LateEntry", f"entry {late.metadata.name} was registered after compensation")
    if phase == "Completed":
        return effects_move(saga) or Wait(finished=True)
    if phase in TERMINAL:
        return Wait(finished=True)
    return Wait()  # Halted: a person resolves it (retry or skip annotations)


def external_move(saga: Saga, entries: Sequence[UndoEntry], now: datetime) -> Move:
    """An agent's saga: it ends by spec.outcome, a deadline or a delete; entries come from the SDK."""
    spec, meta, status = saga.spec, saga.metadata, saga.status
    if spec.outcome == "Abort":
        why = meta.annotations.get(ABORT_REASON_ANNOTATION)
        message = f"spec.outcome is Abort: {why}" if why else "spec.outcome is Abort"
        return Transition("Failed", "Aborted", message, meta.annotations.get(FAILED_STEP_ANNOTATION))
    if meta.deletion_timestamp is not None:
        return Transition("Failed", "Deleted", "the saga was deleted while Active; its effects are undone first")
    deadline = deadline_of(saga)
    if deadline is not None and now >= deadline:
        return Transition(
            "Failed",
            "DeadlineExceeded",
            f"not finished within spec.activeDeadlineSeconds={spec.active_deadline_seconds}",
        )
    if spec.outcome == "Commit":
        return Transition("Completed", "Committed", "spec.outcome is Commit")
    if status.stack_depth != len(entries):
        return UpdateDepth(len(entries))
    return Wait(until=deadline)


def compensating_move(saga: Saga, entries: Sequence[UndoEntry]) -> Move:
    """LIFO: the highest entry still owed. A Failed or lost entry stops the descent under Halt
    (everything above it is compensated first); under Continue the rest goes on first."""
    failure = lifo.blocking_failure(entries)
    owed = lifo.plan(entries)
    halting = saga.spec.compensation_policy.on_failure == "Halt"
    lost = [e for e in saga.status.lost_entries if not e.acknowledged]
    if lost and halting:
        lowest_allowed = max(e.stack_position or 0 for e in lost)
        owed = [e for e in owed if e.spec.stack_position > lowest_allowed]
    if owed and not (halting and failure is not None):
        return CompensateEntry(owed[0])
    if lost:
        names = ", ".join(f"{e.name} ({e.why})" for e in lost)
        return Transition(
            "Halted",
            "EntryLost",
            f"cannot compensate {names}: its effect may remain. Undo it by hand, then "
            f"`kubectl annotate saga {saga.metadata.name} {RETRY_ANNOTATION}=<what you did>` to go on without it",
        )
    if failure is not None:
        return Transition("Halted", *halt_reason(failure, entries))
    return Transition("Compensated", "Compensated", f"{lifo.settled_count(entries)} entries compensated or skipped")


def halt_reason(failure: UndoEntry, entries: Sequence[UndoEntry]) -> tuple[str, str]:
    compensation = failure.spec.compensation
    function = f"{compensation.function} {compensation.version}" if compensation else "no function"
    failed = [e for e in entries if e.status.state == "Failed"]
    error = failure.status.last_error or "unknown error"
    reason = "FunctionNotFound" if error.startswith("FunctionNotFound") else "CompensationFailed"
    others = f" ({len(failed) - 1} more failed)" if len(failed) > 1 else ""
    return reason, (
        f"entry {failure.metadata.name} (step {failure.spec.step}, {function}) could not be compensated: "
        f"{error}{others}. Fix the cause, then `kubectl annotate saga {failure.spec.saga} {RETRY_ANNOTATION}=now`, "
        f'or skip it with `kubectl annotate undo {failure.metadata.name} {SKIP_ANNOTATION}="<why>"`'
    )


def halted_forward(saga: Saga) -> bool:
    return saga.status.phase == "Halted" and saga.status.reason == "ForwardRecoveryExhausted"


def annotation_move(saga: Saga, entries: Sequence[UndoEntry]) -> Move | None:
    phase = saga.status.phase
    request = saga.metadata.annotations.get(RETRY_ANNOTATION)
    if request is not None:
        if phase == "Halted":
            return Retry(request, "Active" if halted_forward(saga) else "Compensating")
        if phase == "Completed" and any(e.state == "Failed" for e in saga.status.effects):
            return Retry(request, "Completed")
        return RefuseAnnotation(None, RETRY_ANNOTATION, f"retry ignored: the saga is {phase}, not Halted")
    for entry in sorted(entries, key=lambda e: e.spec.stack_position, reverse=True):
        reason = entry.metadata.annotations.get(SKIP_ANNOTATION)
        if reason is None:
            continue
        if phase == "Halted" and halted_forward(saga) and entry.status.effect == "Failed":
            return SkipEntry(entry, reason or "skipped by a person", "Active")
        if phase == "Halted" and not halted_forward(saga) and entry.status.state in ("Failed", "Pending"):
            return SkipEntry(entry, reason or "skipped by a person", "Compensating")
        return RefuseAnnotation(
            entry,
            SKIP_ANNOTATION,
            f"skip of {entry.metadata.name} ignored: only a Pending or Failed entry of a Halted saga can be "
            f"skipped (saga {phase}, entry {entry.status.state})",
        )
    return None


def holds_finalizer(saga: Saga) -> bool:
    """Work is left that a delete must not cut short: not final, or effects still to send."""
    return saga.status.phase not in TERMINAL or (saga.status.phase == "Completed" and effects_move(saga) is not None)


def metadata_move(saga: Saga) -> SyncMetadata | None:
    """Labels follow the phase; the finalizer is held until the saga is final (effects sent),
    then released so that deleting a finished saga needs no operator."""
    meta = saga.metadata
    labels = {k: v for k, v in desired_labels(saga).items() if meta.labels.get(k) != v}
    if not holds_finalizer(saga):
        finalizers = [f for f in meta.finalizers if f != FINALIZER]
    elif FINALIZER not in meta.finalizers and meta.deletion_timestamp is None:
        finalizers = [*meta.finalizers, FINALIZER]
    else:
        finalizers = meta.finalizers
    if not labels and finalizers == meta.finalizers:
        return None
    return SyncMetadata(labels, finalizers)


def desired_labels(saga: Saga, phase: SagaPhase | None = None) -> dict[str, str | None]:
    phase = phase or saga.status.phase
    return {PHASE_LABEL: phase.lower() if phase else None, ORG_LABEL: saga.spec.org_id}


def deadline_of(saga: Saga) -> datetime | None:
    seconds = saga.spec.active_deadline_seconds
    start = saga.status.start_time or saga.metadata.creation_timestamp
    if seconds is None or start is None:
        return None
    return start + timedelta(seconds=seconds)


# -- status ----------------------------------------------------------------------------------

# Each phase's (Succeeded, Compensated, Halted) condition statuses.
CONDITIONS: dict[SagaPhase, tuple[ConditionStatus, ConditionStatus, ConditionStatus]] = {
    "Active": ("Unknown", "Unknown", "False"),
    "Completed": ("True", "False", "False"),
    "Failed": ("False", "Unknown", "False"),
    "Compensating": ("False", "Unknown", "False"),
    "Compensated": ("False", "True", "False"),
    "Halted": ("False", "False", "True"),
}
PHASE_CONDITIONS = ("Succeeded", "Compensated", "Halted")


def with_phase(
    status: SagaStatus,
    phase: SagaPhase,
    *,
    reason: str,
    message: str,
    now: datetime,
    generation: int,
) -> SagaStatus:
    """The status after entering `phase`, conditions included (transition times kept when unchanged).

    A forward-recovery halt leaves Compensated at Unknown: nothing was compensated, nor will be."""
    values = CONDITIONS[phase]
    if phase == "Halted" and reason == "ForwardRecoveryExhausted":
        values = ("Unknown", "False", "True")
    conditions = [
        condition(status.conditions, type_, value, reason, message, now, generation)
        for type_, value in zip(PHASE_CONDITIONS, values, strict=True)
    ]
    others = [c for c in status.conditions if c.type not in PHASE_CONDITIONS]
    return status.model_copy(
        update={
            "phase": phase,
            "reason": reason,
            "message": message,
            "conditions": conditions + others,
            "start_time": status.start_time or now,
            "completion_time": now if phase in TERMINAL else None,
            "observed_generation": generation,
        }
    )


def condition(
    previous: Sequence[Condition],
    type_: str,
    value: ConditionStatus,
    reason: str,
    message: str,
    now: datetime,
    generation: int,
) -> Condition:
    """A condition after a transition: reason, message and time change only when the status does,
    so Succeeded=False keeps saying why the saga failed while it is compensated."""
    before = next((c for c in previous if c.type == type_), None)
    if before is not None and before.status == value:
        return before.model_copy(update={"observed_generation": generation})
    return Condition(
        type=type_,
        status=value,
        reason=reason,
        message=message,
        last_transition_time=now,
        observed_generation=generation,
    )
