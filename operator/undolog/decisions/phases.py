"""The saga state machine: given a saga and its entries, the next move.

Active -> Completed, or Active -> Failed -> Compensating -> Compensated | Halted.
`decide` is pure: the controller applies the move it returns (one API write or one call),
then asks again with what the write returned, until the answer is to wait.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from undolog.api.common import Condition, ConditionStatus
from undolog.api.saga import Saga, SagaPhase, SagaStatus
from undolog.api.undo_entry import UndoEntry
from undolog.decisions import lifo

FINALIZER = "undolog.io/compensate-before-delete"
PHASE_LABEL = "undolog.io/phase"
ORG_LABEL = "undolog.io/org"
RETRY_ANNOTATION = "undolog.io/retry"
ABORT_REASON_ANNOTATION = "undolog.io/abort-reason"  # why the agent or person aborted (SDK, CLI)
FAILED_STEP_ANNOTATION = "undolog.io/failed-step"  # the step whose failure made the agent abort
SKIP_ANNOTATION = "undolog.io/skip"
TERMINAL: frozenset[SagaPhase] = frozenset({"Completed", "Compensated"})


# -- moves -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Initialize:
    """First sight: status Active with every condition set (Unknown where not yet known)."""


@dataclass(frozen=True)
class SyncMetadata:
    """Labels and finalizer differ from what the status implies."""

    labels: dict[str, str | None]
    finalizers: list[str]


@dataclass(frozen=True)
class UpdateDepth:
    """An agent registered entries: status.stackDepth follows."""

    stack_depth: int


@dataclass(frozen=True)
class Fail:
    reason: str
    message: str
    failed_step: str | None = None


@dataclass(frozen=True)
class Complete:
    reason: str
    message: str


@dataclass(frozen=True)
class StartCompensating:
    reason: str
    message: str


@dataclass(frozen=True)
class CompensateEntry:
    """Compensate (or skip, when it has no compensation) this entry, the highest one owed."""

    entry: UndoEntry


@dataclass(frozen=True)
class FinishCompensation:
    phase: SagaPhase  # Compensated or Halted
    reason: str
    message: str


@dataclass(frozen=True)
class Retry:
    """A person asked to retry a Halted saga: Failed entries go back to Pending."""

    request: str


@dataclass(frozen=True)
class SkipEntry:
    """A person marked an entry of a Halted saga Skipped."""

    entry: UndoEntry
    reason: str


@dataclass(frozen=True)
class RefuseAnnotation:
    """A resolution annotation that does not apply now: removed, with a warning Event."""

    entry: UndoEntry | None  # None: the annotation is on the saga
    key: str
    message: str


@dataclass(frozen=True)
class Wait:
    """Nothing to do until an event arrives, or until `until` (a deadline)."""

    until: datetime | None = None
    finished: bool = False  # final phase with nothing owed: the driver may stop


Move = (
    Initialize
    | SyncMetadata
    | UpdateDepth
    | Fail
    | Complete
    | StartCompensating
    | CompensateEntry
    | FinishCompensation
    | Retry
    | SkipEntry
    | RefuseAnnotation
    | Wait
)


# -- decision --------------------------------------------------------------------------------


def decide(saga: Saga, entries: Sequence[UndoEntry], now: datetime) -> Move:
    meta = saga.metadata
    if saga.status.phase is None:
        # The finalizer first: from the moment the saga is Active, deleting it compensates it.
        if FINALIZER not in meta.finalizers and meta.deletion_timestamp is None:
            return SyncMetadata({}, [*meta.finalizers, FINALIZER])
        return Initialize()
    annotation = annotation_move(saga, entries)
    if annotation is not None:
        return annotation
    move = phase_move(saga, entries, now)
    # Labels and finalizer follow the phase, but not through phases passed in a few
    # milliseconds: they are written before anything slow (a call, waiting).
    if isinstance(move, (CompensateEntry, Wait)):
        return metadata_move(saga) or move
    return move


def phase_move(saga: Saga, entries: Sequence[UndoEntry], now: datetime) -> Move:
    phase = saga.status.phase
    if phase == "Active":
        return active_move(saga, entries, now)
    if phase == "Failed":
        return StartCompensating("Compensating", f"undoing {len(lifo.plan(entries))} entries newest-first")
    if phase == "Compensating":
        return compensating_move(saga, entries)
    if phase == "Compensated" and lifo.plan(entries):
        late = lifo.plan(entries)[0]
        return StartCompensating("LateEntry", f"entry {late.metadata.name} was registered after compensation")
    if phase in TERMINAL:
        return Wait(finished=True)
    return Wait()  # Halted: a person resolves it (retry or skip annotations)


def active_move(saga: Saga, entries: Sequence[UndoEntry], now: datetime) -> Move:
    spec, meta, status = saga.spec, saga.metadata, saga.status
    if spec.outcome == "Abort":
        why = meta.annotations.get(ABORT_REASON_ANNOTATION)
        message = f"spec.outcome is Abort: {why}" if why else "spec.outcome is Abort"
        return Fail("Aborted", message, meta.annotations.get(FAILED_STEP_ANNOTATION))
    if meta.deletion_timestamp is not None:
        return Fail("Deleted", "the saga was deleted while Active; its effects are undone before it goes")
    deadline = deadline_of(saga)
    if deadline is not None and now >= deadline:
        return Fail(
            "DeadlineExceeded",
            f"not finished within spec.activeDeadlineSeconds={spec.active_deadline_seconds}",
        )
    if spec.outcome == "Commit":
        return Complete("Committed", "spec.outcome is Commit")
    if status.stack_depth != len(entries):
        return UpdateDepth(len(entries))
    return Wait(until=deadline)


def compensating_move(saga: Saga, entries: Sequence[UndoEntry]) -> Move:
    failure = lifo.blocking_failure(entries)
    owed = lifo.plan(entries)
    halting = saga.spec.compensation_policy.on_failure == "Halt"
    if owed and not (halting and failure is not None):
        return CompensateEntry(owed[0])
    if failure is not None:
        return FinishCompensation("Halted", *halt_reason(failure, entries))
    return FinishCompensation(
        "Compensated", "Compensated", f"{lifo.settled_count(entries)} entries compensated or skipped"
    )


def halt_reason(failure: UndoEntry, entries: Sequence[UndoEntry]) -> tuple[str, str]:
    compensation = failure.spec.compensation
    function = f"{compensation.function} {compensation.version}" if compensation else "no function"
    failed = [e for e in entries if e.status.state == "Failed"]
    reason = (
        "FunctionNotFound"
        if (failure.status.last_error or "").startswith("FunctionNotFound")
        else ("CompensationFailed")
    )
    others = f" ({len(failed) - 1} more failed)" if len(failed) > 1 else ""
    return reason, (
        f"entry {failure.metadata.name} (step {failure.spec.step}, {function}) could not be compensated: "
        f"{failure.status.last_error or 'unknown error'}{others}. "
        f"Fix the cause, then `kubectl annotate saga {failure.spec.saga} {RETRY_ANNOTATION}=now`, or skip it "
        f'with `kubectl annotate undo {failure.metadata.name} {SKIP_ANNOTATION}="<why>"`'
    )


def annotation_move(saga: Saga, entries: Sequence[UndoEntry]) -> Move | None:
    phase = saga.status.phase
    request = saga.metadata.annotations.get(RETRY_ANNOTATION)
    if request is not None:
        if phase == "Halted":
            return Retry(request)
        return RefuseAnnotation(None, RETRY_ANNOTATION, f"retry ignored: the saga is {phase}, not Halted")
    for entry in sorted(entries, key=lambda e: e.spec.stack_position, reverse=True):
        reason = entry.metadata.annotations.get(SKIP_ANNOTATION)
        if reason is None:
            continue
        if phase == "Halted" and entry.status.state in ("Failed", "Pending"):
            return SkipEntry(entry, reason or "skipped by a person")
        return RefuseAnnotation(
            entry,
            SKIP_ANNOTATION,
            f"skip of {entry.metadata.name} ignored: only a Pending or Failed entry of a Halted saga can be "
            f"skipped (saga {phase}, entry {entry.status.state})",
        )
    return None


def metadata_move(saga: Saga) -> SyncMetadata | None:
    """Labels follow the phase; the finalizer is held until the saga is final, then released
    so that deleting a finished saga needs no operator."""
    meta = saga.metadata
    labels = {k: v for k, v in desired_labels(saga).items() if meta.labels.get(k) != v}
    has_finalizer = FINALIZER in meta.finalizers
    if saga.status.phase in TERMINAL:
        finalizers = [f for f in meta.finalizers if f != FINALIZER]
    elif not has_finalizer and meta.deletion_timestamp is None:
        finalizers = [*meta.finalizers, FINALIZER]
    else:
        finalizers = meta.finalizers
    if not labels and finalizers == meta.finalizers:
        return None
    return SyncMetadata(labels, finalizers)


def desired_labels(saga: Saga) -> dict[str, str | None]:
    phase = saga.status.phase
    return {
        PHASE_LABEL: phase.lower() if phase else None,
        ORG_LABEL: saga.spec.org_id,
    }


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


def with_phase(
    status: SagaStatus,
    phase: SagaPhase,
    *,
    reason: str,
    message: str,
    now: datetime,
    generation: int,
) -> SagaStatus:
    """The status after entering `phase`, conditions included (transition times kept when unchanged)."""
    succeeded, compensated, halted = CONDITIONS[phase]
    conditions = [
        condition(status.conditions, "Succeeded", succeeded, reason, message, now, generation),
        condition(status.conditions, "Compensated", compensated, reason, message, now, generation),
        condition(status.conditions, "Halted", halted, reason, message, now, generation),
    ]
    return status.model_copy(
        update={
            "phase": phase,
            "reason": reason,
            "message": message,
            "conditions": conditions,
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
