"""Reasons of the Events UndoLog posts, besides the saga's phases (an Event named after the
phase marks each transition): `kubectl describe saga` reads as the saga's timeline."""

from __future__ import annotations

from enum import StrEnum

from undolog.api.saga import SagaPhase


class EventReason(StrEnum):
    # Calls, one Event per attempt that failed and per call that ended.
    STEP_COMMITTED = "StepCommitted"
    STEP_FAILED = "StepFailed"
    FORWARD_RETRY = "ForwardRetry"
    ENTRY_COMPENSATED = "EntryCompensated"
    COMPENSATION_RETRY = "CompensationRetry"
    COMPENSATION_FAILED = "CompensationFailed"
    CONFLICT = "Conflict"  # the undo would overwrite a later change: not sent
    UNDO_ANYWAY = "UndoAnyway"  # a person's resolution of a Conflict, on the entry
    EFFECT_DELIVERED = "EffectDelivered"
    EFFECT_RETRY = "EffectRetry"
    EFFECT_FAILED = "EffectFailed"
    # On a Webhook: its participant stopped answering, or answers again.
    PARTICIPANT_UNAVAILABLE = "ParticipantUnavailable"
    PARTICIPANT_AVAILABLE = "ParticipantAvailable"
    # A call that could not be made at all (nothing sent): its Event's reason is the entry's own,
    # one of undo_entry.CALL_REFUSALS (timeline.Reason).
    # Entries.
    ENTRY_SKIPPED = "EntrySkipped"
    SKIPPED = "Skipped"  # by a person, on the entry
    ENTRY_LOST = "EntryLost"
    ENTRY_NOT_OWNED = "EntryNotOwned"
    ENTRY_AFTER_COMPLETION = "EntryAfterCompletion"
    SAGA_NOT_FOUND = "SagaNotFound"
    # The saga.
    SAGA_UNREADABLE = "SagaUnreadable"
    PIVOT_COMMITTED = "PivotCommitted"
    ABORT_REFUSED = "AbortRefused"
    REWIND_REFUSED = "RewindRefused"
    ANNOTATION_IGNORED = "AnnotationIgnored"
    OPERATOR_ERROR = "OperatorError"


# Successes the status records with their time either way: a call that succeeded (its entry's or
# saga's attempts) and a saga's successful end (its phase, Succeeded condition and completionTime).
# An Event for each is one more API write, so the operator posts these only with --success-events;
# every Warning, and every other phase change, is always an Event.
SUCCESSES: frozenset[EventReason | SagaPhase] = frozenset(
    {
        EventReason.STEP_COMMITTED,
        EventReason.ENTRY_COMPENSATED,
        EventReason.EFFECT_DELIVERED,
        SagaPhase.COMPLETED,
        SagaPhase.COMPENSATED,
    }
)
