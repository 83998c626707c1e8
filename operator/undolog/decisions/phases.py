"""The saga state machine: given a saga, its entries and how far they are proven complete,
the next move.

Active -> Completed, or Active -> Failed -> Compensating -> Compensated | Halted; and
Active -> Rewinding -> Active (or Halted) when spec.rewind asks for a partial rollback.
`decide` is pure: the controller applies the move it returns (one API write, read or call),
then asks again with what it got back, until the answer is to wait.

Completeness: a saga's entries reach the operator by a watch, which can lag (after an outage
it may be seconds behind). So no compensation starts until a proof taken after the failure has
shown every entry (EntryProof.STALE or better: LIFO holds from the top of the real stack), and
the saga becomes Compensated, releasing its finalizer, only on a proof taken after the last call
(EntryProof.FRESH): every entry registered for it is compensated or skipped. A proof is a
consistent listing, or the watch's progress past a revision (docs/design.md says when).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from datetime import datetime, timedelta

from undolog.api import TERMINAL as TERMINAL  # re-exported: the phases a saga is finished in
from undolog.api import (
    Condition,
    ConditionStatus,
    ConditionType,
    EntryReason,
    EntryState,
    LostEntry,
    OnFailure,
    Outcome,
    Rewind,
    RewindState,
    Saga,
    SagaPhase,
    SagaReason,
    SagaStatus,
    UndoEntry,
)
from undolog.api.changes import changed
from undolog.conventions import (
    ABORT_REASON_ANNOTATION,
    ENTRY_RESOLUTIONS,
    FAILED_STEP_ANNOTATION,
    FINALIZER,
    MAX_NAME,
    ORG_LABEL,
    PHASE_LABEL,
    RETRY_ANNOTATION,
    SKIP_ANNOTATION,
    UNDO_ANYWAY_ANNOTATION,
    clip,
)
from undolog.decisions import compensation_plan, resolutions, rewind
from undolog.decisions.forward import effects_move, forward_move
from undolog.decisions.moves import (
    CompensateEntries,
    EntryProof,
    ExecuteStep,
    Initialize,
    Move,
    ProveEntries,
    RecordLateEntry,
    RefuseAnnotation,
    RefuseRewind,
    RegisterStep,
    Retry,
    SkipEntry,
    SyncMetadata,
    Transition,
    UndoAnyway,
    UpdateDepth,
    Wait,
)
from undolog.decisions.retention import kept_long
from undolog.decisions.stack import Stack

FINAL: frozenset[SagaPhase] = TERMINAL | {SagaPhase.HALTED}  # nothing moves without a person
# An orchestrated saga's steps start before Active is written, for this long after its creation.
ACTIVE_WRITE_AFTER = timedelta(seconds=2)


def decide(saga: Saga, entries: Collection[UndoEntry], now: datetime, proof: EntryProof = EntryProof.NONE) -> Move:
    """The next move. `entries` as a Stack (the driver's) costs the same at any depth; any other
    collection is made one first."""
    return decided(saga, Stack.of(entries), now, proof)


def decided(saga: Saga, entries: Stack, now: datetime, proof: EntryProof) -> Move:
    meta = saga.metadata
    if saga.status.phase is None:
        # The finalizer first: from the moment the saga is Active, deleting it compensates it.
        # The same write labels it active, one write early rather than one write more.
        if FINALIZER not in meta.finalizers and meta.deletion_timestamp is None:
            labels = {k: v for k, v in desired_labels(saga, SagaPhase.ACTIVE).items() if meta.labels.get(k) != v}
            return SyncMetadata(labels, [*meta.finalizers, FINALIZER])
        return (
            steps_before_active(saga, entries, now) or failed_before_active(saga, entries, now, proof) or Initialize()
        )
    annotation = annotation_move(saga, entries)
    if annotation is not None:
        return annotation
    move = phase_move(saga, entries, now, proof)
    if isinstance(move, Transition) and move.phase == SagaPhase.FAILED and saga.status.phase != SagaPhase.FAILED:
        move = failing(move, entries, proof)
    # Labels and the finalizer follow the phase when the saga waits (Active, Halted, final),
    # not through the phases it passes on its way: one write per saga instead of one per phase,
    # and none between an abort and its first compensation call.
    if not isinstance(move, Wait):
        return move
    return metadata_move(saga) or move


def steps_before_active(saga: Saga, entries: Collection[UndoEntry], now: datetime) -> Move | None:
    """An orchestrated saga's steps, run before its Active status is written, within a moment of
    its creation: most sagas finish within it, and Completed is then their first status write
    (one saga write and its Active Event fewer). The finalizer is already held. Anything but a
    step to register or send, or the completion (a failure, a pivot, a wait, a rewind, a
    person's annotation, or the moment gone) is decided from Active, written first, as always."""
    created = saga.metadata.creation_timestamp
    if not saga.spec.steps or created is None or now >= created + ACTIVE_WRITE_AFTER:
        return None
    if rewind.requested(saga) is not None or annotation_move(saga, Stack.of(entries)) is not None:
        return None
    move = forward_move(saga, entries, now, deadline_of(saga))
    if isinstance(move, (RegisterStep, ExecuteStep)):
        return move
    if isinstance(move, Transition) and move.phase == SagaPhase.COMPLETED:
        return move
    return None


def proof_due_by(saga: Saga, at: datetime) -> bool:
    """Whether this copy of the saga needed its entries proven already at `at` (it had failed,
    committed, or gone past Active by then): a listing of its entries taken after `at` proves
    them for it."""
    if saga.status.phase not in (None, SagaPhase.ACTIVE):
        return True
    return failure_of(saga, at) is not None or saga.spec.outcome == Outcome.COMMIT


def failed_before_active(saga: Saga, entries: Stack, now: datetime, proof: EntryProof) -> Move | None:
    """An agent's saga that failed before the operator first wrote its status (aborted while the
    operator was down): Compensating is its first status, the failure on its conditions as from
    Active. One saga write fewer, and the listing taken on taking charge proves its entries."""
    if saga.spec.steps:
        return None
    failure = failure_of(saga, now)
    return None if failure is None else failing(failure, entries, proof)


# Why a saga fails: it then goes straight to Compensating, with the failure kept on its
# Succeeded condition (reason, message, time) and in a Warning Event named Failed.
FAILURE_REASONS = frozenset(
    {
        SagaReason.ABORTED,
        SagaReason.DELETED,
        SagaReason.DEADLINE_EXCEEDED,
        SagaReason.STEP_FAILED,
        SagaReason.STEP_NOT_REGISTERED,
        SagaReason.INVALID_REFERENCE,
    }
)


def failing(failure: Transition, entries: Stack, proof: EntryProof) -> Move:
    """A failure and the start of its compensation in one write, once a LIST taken now has shown
    every entry (the compensation starts from the real top of the stack)."""
    if proof == EntryProof.NONE:
        return ProveEntries()
    owed = compensation_plan.owed_count(entries)
    return Transition(
        SagaPhase.COMPENSATING,
        failure.reason,
        f"{failure.message}; undoing {owed} {'entry' if owed == 1 else 'entries'}",
        failed_step=failure.failed_step,
    )


def phase_move(saga: Saga, entries: Stack, now: datetime, proof: EntryProof) -> Move:
    phase = saga.status.phase
    if phase == SagaPhase.ACTIVE:
        request = rewind.requested(saga)
        if request is not None:
            return start_rewind(saga, entries, request, now)
        if saga.spec.steps:
            return forward_move(saga, entries, now, deadline_of(saga))
        return external_move(saga, entries, now, proof)
    if phase == SagaPhase.FAILED:
        if proof == EntryProof.NONE:
            return ProveEntries()
        owed = compensation_plan.owed_count(entries)
        return Transition(SagaPhase.COMPENSATING, SagaReason.COMPENSATING, f"undoing {owed} entries newest-first")
    if phase == SagaPhase.COMPENSATING:
        return compensating_move(saga, entries, proof)
    if phase == SagaPhase.REWINDING:
        return rewinding_move(saga, entries, now, proof)
    late = entries.highest(compensation_plan.OWED) if phase == SagaPhase.COMPENSATED else None
    if late is not None:
        return Transition(
            SagaPhase.COMPENSATING,
            SagaReason.LATE_ENTRY,
            f"entry {late.metadata.name} was registered after the saga was compensated",
        )
    if phase == SagaPhase.COMPLETED:
        after = registered_after_completion(saga, entries)
        if after:
            return RecordLateEntry(after[0])
        return effects_move(saga) or Wait(finished=True)
    if phase in TERMINAL:
        return Wait(finished=True)
    return Wait()  # Halted: a person resolves it (retry or skip annotations)


def failure_of(saga: Saga, now: datetime) -> Transition | None:
    """An agent's saga (or a rewinding one) fails by spec.outcome Abort, a delete or its deadline."""
    spec, meta = saga.spec, saga.metadata
    if spec.outcome == Outcome.ABORT:
        why = meta.annotations.get(ABORT_REASON_ANNOTATION)
        message = f"spec.outcome is Abort: {why}" if why else "spec.outcome is Abort"
        failed_step = meta.annotations.get(FAILED_STEP_ANNOTATION)
        return Transition(
            SagaPhase.FAILED, SagaReason.ABORTED, message, clip(failed_step, MAX_NAME) if failed_step else None
        )
    if meta.deletion_timestamp is not None:
        return Transition(
            SagaPhase.FAILED, SagaReason.DELETED, "the saga was deleted while Active; its effects are undone first"
        )
    deadline = deadline_of(saga)
    if deadline is not None and now >= deadline:
        return Transition(
            SagaPhase.FAILED,
            SagaReason.DEADLINE_EXCEEDED,
            f"not finished within spec.activeDeadlineSeconds={spec.active_deadline_seconds}",
        )
    return None


def external_move(saga: Saga, entries: Stack, now: datetime, proof: EntryProof) -> Move:
    """An agent's saga: it ends by spec.outcome, a deadline or a delete; entries come from the SDK."""
    spec, status = saga.spec, saga.status
    failure = failure_of(saga, now)
    if failure is not None:
        return failure
    deadline = deadline_of(saga)
    if spec.outcome == Outcome.COMMIT:
        # The top of the stack at the commit is proven, so a later entry can be told apart.
        if proof == EntryProof.NONE:
            return ProveEntries()
        return Transition(SagaPhase.COMPLETED, SagaReason.COMMITTED, "spec.outcome is Commit")
    if status.stack_depth != len(entries):
        return UpdateDepth(len(entries))
    return Wait(until=deadline)


def registered_after_completion(saga: Saga, entries: Stack) -> list[UndoEntry]:
    """Entries of a Completed external saga above the top of its stack at the commit."""
    top = saga.status.top_position
    highest = entries.highest(compensation_plan.OWED)
    if saga.spec.steps or top is None or highest is None or highest.spec.stack_position <= top:
        return []  # the highest owed entry is at or below the top: so is every other
    return [e for e in entries if e.spec.stack_position > top and e.status.state in compensation_plan.OWED]


def start_rewind(saga: Saga, entries: Stack, request: Rewind, now: datetime) -> Move:
    refused = rewind.refusal(saga, request)
    if refused is not None:
        return RefuseRewind(rewind.refused(request, refused))
    above = sum(1 for e in entries if e.spec.stack_position > request.to_position and e.status.rewound_at is None)
    return Transition(
        SagaPhase.REWINDING,
        SagaReason.REWINDING,
        f"rewinding to position {request.to_position}: undoing {above} entries above it ({request.reason})",
        rewind=rewind.started(request, now),
    )


def rewinding_move(saga: Saga, entries: Stack, now: datetime, proof: EntryProof) -> Move:
    """Like a compensation, limited to the entries above the rewind's position; then Active."""
    failure = failure_of(saga, now)
    if failure is not None:  # the whole saga is undone now: the compensation takes over
        return failure
    last = saga.status.rewind
    if last is None:  # Rewinding is only entered with status.rewind; never stay in it without
        return Transition(SagaPhase.ACTIVE, SagaReason.REWOUND, "no rewind recorded in status.rewind: Active again")
    times = [e.status.rewound_at for e in entries if e.spec.stack_position > last.to_position]
    undone = sum(1 for t in times if t is not None and (last.started_at is None or t >= last.started_at))
    finished = Transition(
        SagaPhase.ACTIVE,
        SagaReason.REWOUND,
        f"rewound to position {last.to_position}: {undone} entries undone; the saga goes on from there",
        rewind=changed(last, {"state": RewindState.DONE, "finished_at": now, "undone": undone}),
    )
    scope = {e.metadata.name for e in rewind.undone_by(saga, entries)}
    return compensating_move(saga, entries, proof, scope=scope, finished=finished)


def compensating_move(
    saga: Saga,
    entries: Stack,
    proof: EntryProof,
    *,
    scope: set[str] | None = None,
    finished: Move | None = None,
) -> Move:
    """The entries the dependency order lets go now (strict LIFO: the highest one owed), once a
    LIST has shown where the top of the stack is. Under Halt a Failed entry keeps what it
    depends on waiting (without dependsOn: everything below it), and a lost entry everything
    below it; under Continue the rest goes on first. Compensated only on a fresh LIST.
    A rewind limits it to `scope` (entry names) and ends with `finished` instead."""
    if proof == EntryProof.NONE:
        return ProveEntries()
    in_scope = entries if scope is None else Stack(e for e in entries if e.metadata.name in scope)
    failure = compensation_plan.blocking_failure(in_scope)
    halting = saga.spec.compensation_policy.on_failure == OnFailure.HALT
    ready = compensation_plan.ready(entries, failed_blocks=halting)
    ready = [e for e in ready if scope is None or e.metadata.name in scope]
    lost = [e for e in saga.status.lost_entries if not e.acknowledged] if scope is None else []
    if lost and halting:
        lowest_allowed = max(e.stack_position or 0 for e in lost)
        ready = [e for e in ready if e.spec.stack_position > lowest_allowed]
    if ready:
        return CompensateEntries(tuple(ready[: compensation_plan.PARALLEL]))
    if lost:
        return Transition(SagaPhase.HALTED, SagaReason.ENTRY_LOST, lost_message(saga, lost))
    if failure is not None:
        return Transition(SagaPhase.HALTED, *halt_reason(saga, failure, in_scope))
    if proof != EntryProof.FRESH:
        return ProveEntries()
    if finished is not None:
        return finished
    if saga.status.unowned_entries:  # their effects were not undone: never filed under success
        return Transition(SagaPhase.HALTED, SagaReason.UNOWNED_ENTRIES, unowned_message(saga))
    return Transition(
        SagaPhase.COMPENSATED,
        SagaReason.COMPENSATED,
        f"{compensation_plan.settled_count(entries)} entries compensated or skipped",
    )


HALT_REASONS: dict[EntryReason | None, SagaReason] = {
    EntryReason.FUNCTION_NOT_FOUND: SagaReason.FUNCTION_NOT_FOUND,
    EntryReason.PARTICIPANT_UNAVAILABLE: SagaReason.PARTICIPANT_UNAVAILABLE,
    EntryReason.CONFLICT: SagaReason.CONFLICT,
}


def halt_reason(saga: Saga, failure: UndoEntry, entries: Collection[UndoEntry]) -> tuple[SagaReason, str]:
    compensation = failure.spec.compensation
    function = f"{compensation.function} {compensation.version}" if compensation else "no function"
    failed = [e for e in entries if e.status.state == EntryState.FAILED]
    error = failure.status.last_error or "unknown error"
    reason = HALT_REASONS.get(failure.status.reason, SagaReason.COMPENSATION_FAILED)
    others = f" ({len(failed) - 1} more failed)" if len(failed) > 1 else ""
    if reason == SagaReason.CONFLICT:  # its error names the three ways out already
        return reason, f"entry {failure.metadata.name} (step {failure.spec.step}) was not undone{others}: {error}"
    return reason, (
        f"entry {failure.metadata.name} (step {failure.spec.step}, {function}) could not be compensated: "
        f"{error}{others}. {resolutions.how_to_resolve(saga, failure)}"
    )


def annotation_move(saga: Saga, entries: Stack) -> Move | None:
    """A person's retry (on the saga), skip or undo anyway (on an entry), checked by the shared rules."""
    request = saga.metadata.annotations.get(RETRY_ANNOTATION)
    if request is not None:
        verdict = resolutions.retry(saga)
        if isinstance(verdict, resolutions.Allowed):
            return Retry(clip(request, 1024), verdict.resume)
        return RefuseAnnotation(None, RETRY_ANNOTATION, verdict.why)
    for entry in compensation_plan.newest_first(entries.annotated()):
        for key, rule, move, unsaid in ENTRY_MOVES:
            reason = entry.metadata.annotations.get(key)
            if reason is None:
                continue
            verdict = rule(saga, entry)
            if isinstance(verdict, resolutions.Allowed):
                return move(entry, clip(reason or unsaid), verdict.resume)
            return RefuseAnnotation(entry, key, verdict.why)
    return None


# A person's annotations on an entry: its rule, the move it asks for, and the reason when none is given.
ENTRY_MOVES: tuple[
    tuple[str, Callable[[Saga, UndoEntry], resolutions.Verdict], type[SkipEntry | UndoAnyway], str], ...
] = (
    (SKIP_ANNOTATION, resolutions.skip, SkipEntry, "skipped by a person"),
    (UNDO_ANYWAY_ANNOTATION, resolutions.undo_anyway, UndoAnyway, "undone anyway by a person"),
)


def holds_finalizer(saga: Saga) -> bool:
    """Work is left that a delete must not cut short: not final, or effects still to send."""
    phase = saga.status.phase
    return phase not in TERMINAL or (phase == SagaPhase.COMPLETED and effects_move(saga) is not None)


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
    final = FINALIZER in meta.finalizers and FINALIZER not in finalizers
    return SyncMetadata(labels, finalizers, final=final, entries_too=final and kept_long(saga))


def desired_labels(saga: Saga, phase: SagaPhase | None = None) -> dict[str, str | None]:
    phase = phase or saga.status.phase
    return {PHASE_LABEL: phase.lower() if phase else None, ORG_LABEL: saga.spec.org_id}


def deadline_of(saga: Saga) -> datetime | None:
    seconds = saga.spec.active_deadline_seconds
    start = saga.status.start_time or saga.metadata.creation_timestamp
    if seconds is None or start is None:
        return None
    return start + timedelta(seconds=seconds)


def needs_driver(saga: Saga) -> bool:
    """Work is (or may be) left: not final, a finalizer to release, a request to answer."""
    meta = saga.metadata
    return (
        saga.status.phase not in TERMINAL
        or FINALIZER in meta.finalizers
        or RETRY_ANNOTATION in meta.annotations
        or metadata_move(saga) is not None
    )


def entry_needs_saga(entry: UndoEntry) -> bool:
    """An entry event that may give its saga work: one still owed, or a person's annotation."""
    annotations = entry.metadata.annotations
    return entry.status.state in compensation_plan.OWED or any(key in annotations for key in ENTRY_RESOLUTIONS)


def unclaimed(entry: UndoEntry) -> bool:
    """An owed entry nobody has reported as missing its saga yet."""
    return entry.status.state in compensation_plan.OWED and entry.status.reason != EntryReason.SAGA_NOT_FOUND


# -- status ----------------------------------------------------------------------------------

_T, _F, _U = ConditionStatus.TRUE, ConditionStatus.FALSE, ConditionStatus.UNKNOWN
MESSAGE_KEPT = frozenset({ConditionType.SUCCEEDED, ConditionType.HALTED})
PHASE_CONDITIONS = (
    ConditionType.SUCCEEDED,
    ConditionType.COMPENSATED,
    ConditionType.HALTED,
    ConditionType.READY,
    ConditionType.RECONCILING,
    ConditionType.STALLED,
)
# Each phase's condition statuses, in PHASE_CONDITIONS order. Ready is True only when nothing
# is left to do (Completed, Compensated): what GitOps tools read as healthy.
CONDITIONS: dict[SagaPhase, tuple[ConditionStatus, ...]] = {
    SagaPhase.ACTIVE: (_U, _U, _F, _F, _T, _F),
    SagaPhase.COMPLETED: (_T, _F, _F, _T, _F, _F),
    SagaPhase.FAILED: (_F, _U, _F, _F, _T, _F),
    SagaPhase.COMPENSATING: (_F, _U, _F, _F, _T, _F),
    SagaPhase.COMPENSATED: (_F, _T, _F, _T, _F, _F),
    SagaPhase.HALTED: (_F, _F, _T, _F, _F, _T),
    SagaPhase.REWINDING: (_U, _U, _F, _F, _T, _F),
}


MAX_LOST_NAMED = 10  # in the halt message; status.lostEntries lists them all (up to its bound)


def unowned_message(saga: Saga) -> str:
    """Why a saga whose entries are otherwise all settled halts, and the way out."""
    unowned = saga.status.unowned_entries
    named = ", ".join(unowned[:MAX_LOST_NAMED]) + (
        f", and {len(unowned) - MAX_LOST_NAMED} more in status.unownedEntries" if len(unowned) > MAX_LOST_NAMED else ""
    )
    one = len(unowned) == 1
    names, them, were, effects = (
        ("names", "it", "was", "its effect") if one else ("name", "them", "were", "their effects")
    )
    meta = saga.metadata
    return (
        f"{named} {names} this saga in spec.saga but it does not own {them} (no ownerReference to uid {meta.uid}): "
        f"{'it' if one else 'they'} {were} not compensated and {effects} may remain. For each: if it is this saga's "
        f"step, add that ownerReference (apiVersion undolog.io/v1beta1, kind Saga, name {meta.name}, uid {meta.uid}) "
        "and it is compensated; else undo its effect by hand and delete it. Then "
        f"`kubectl annotate saga {meta.name} {RETRY_ANNOTATION}=<what you did>`"
    )


def lost_message(saga: Saga, lost: Sequence[LostEntry]) -> str:
    named = ", ".join(f"{e.name} ({e.why})" for e in lost[:MAX_LOST_NAMED])
    if len(lost) == 1 and not saga.status.lost_entries_omitted:
        what, them, it = named, "its effect may remain", "it"
    else:
        more = len(lost) - MAX_LOST_NAMED
        listed = f", and {more} more in status.lostEntries" if more > 0 else ""
        omitted = saga.status.lost_entries_omitted
        unlisted = f", and {omitted} more not listed (their EntryLost Events name them)" if omitted else ""
        what, them, it = f"{named}{listed}{unlisted}", "their effects may remain", "them"
    return (
        f"cannot compensate {what}: {them}. Undo {it} by hand, then "
        f"`kubectl annotate saga {saga.metadata.name} {RETRY_ANNOTATION}=<what you did>` to go on without {it}"
    )


def with_phase(
    status: SagaStatus,
    phase: SagaPhase,
    *,
    reason: SagaReason,
    message: str,
    now: datetime,
    generation: int,
    expires_at: datetime | None = None,
) -> SagaStatus:
    """The status after entering `phase`, conditions included (transition times kept when unchanged);
    `expires_at`: when retention deletes it, for a final phase (decisions/retention.py).

    A forward-recovery halt leaves Compensated at Unknown: nothing was compensated, nor will be.
    The message is cut to its field's bound (it may quote an agent's or a participant's text)."""
    message = clip(message)
    values = CONDITIONS[phase]
    if phase == SagaPhase.HALTED and reason == SagaReason.FORWARD_RECOVERY_EXHAUSTED:
        values = (_U, _F, _T, _F, _F, _T)
    # The message goes where it is read: on Succeeded (why it failed), on Halted (why it halted,
    # then the person's reason for the retry that resolved it) and on what is True now; another
    # condition that does not hold says only its reason (the message was stored six times).
    conditions = [
        condition(
            status.conditions,
            type_,
            value,
            reason,
            message if type_ in MESSAGE_KEPT or value == _T else "",
            now,
            generation,
        )
        for type_, value in zip(PHASE_CONDITIONS, values, strict=True)
    ]
    others = [c for c in status.conditions if c.type not in PHASE_CONDITIONS]
    return changed(
        status,
        {
            "phase": phase,
            "reason": reason,
            "message": message,
            "conditions": conditions + others,
            "start_time": status.start_time or now,
            "completion_time": now if phase in TERMINAL else None,
            "expires_at": expires_at if phase in TERMINAL else None,
            "observed_generation": generation,
        },
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
        return changed(before, {"observed_generation": generation})
    return Condition(
        type=type_,
        status=value,
        reason=reason,
        message=message,
        last_transition_time=now,
        observed_generation=generation,
    )
