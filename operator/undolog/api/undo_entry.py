"""UndoEntry: one step's ledger record, written before the step runs."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import Field, JsonValue

from undolog.api.common import API_VERSION, MAX_MESSAGE, STEP_NAME, Call, Model, ObjectMeta

EffectState = Literal["Pending", "Executing", "Committed", "Failed"]
UndoEntryState = Literal["Pending", "Running", "Compensated", "Failed", "Skipped"]
AttemptKind = Literal["Forward", "Compensation", "Effect"]

MAX_ATTEMPTS = 10
UUID = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"

# string(int) has no size bound for CEL's cost estimate, so the position is parsed out of the
# name instead of formatted into it.
_POSITION_IN_NAME = "self.metadata.name.substring(size(self.spec.saga) + 1)"
ROOT_RULES: list[JsonValue] = [
    {
        "rule": f"self.metadata.name.startsWith(self.spec.saga + '-') && {_POSITION_IN_NAME}.matches('^[0-9]+$')"
        f" && int({_POSITION_IN_NAME}) == self.spec.stackPosition",
        "message": (
            "metadata.name must be <spec.saga>-<spec.stackPosition>, which makes one entry per saga and position"
        ),
    },
    {
        "rule": "!has(self.status) || !has(self.status.executedAt) || "
        "timestamp(self.status.executedAt) > timestamp(self.spec.registeredAt)",
        "message": "status.executedAt must come after spec.registeredAt: register before execute",
        "fieldPath": ".status.executedAt",
    },
]


class UndoEntrySpec(Model):
    """The effect and how to undo it. Immutable once created."""

    saga: str = Field(max_length=200, description="Name of the Saga (same namespace) this entry belongs to.")
    undo_id: str = Field(pattern=UUID, description="UUID; the compensation's Idempotency-Key is undo-<undoId>.")
    stack_position: int = Field(
        ge=0,
        le=1_000_000,
        description="Order in the saga's undo stack; compensations run from the highest down.",
    )
    effect_id: str = Field(max_length=253, description="Identifies the effect, e.g. the forward Idempotency-Key.")
    step: str = Field(max_length=63, pattern=STEP_NAME, description="Name of the step (or tool call).")
    compensation: Call | None = Field(
        default=None, description="How to undo the effect; absent for Pivot and Retriable steps."
    )
    registered_at: datetime = Field(
        description="RFC 3339 time with microseconds at which the entry was written, before the effect ran."
    )

    model_config = Model.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                {"rule": "self == oldSelf", "message": "spec is immutable once the UndoEntry is created"}
            ]
        }
    }


class Attempt(Model):
    """One call made for this entry."""

    kind: AttemptKind = Field(description="Forward, Compensation or Effect.")
    time: datetime = Field(description="When the call started.")
    number: int = Field(ge=1, description="1 for the first attempt; the Undolog-Attempt header.")
    status_code: int | None = Field(default=None, ge=100, le=599, description="HTTP status, if any came back.")
    error: str | None = Field(default=None, max_length=1024, description="What went wrong, if anything.")
    duration_milliseconds: int = Field(ge=0, description="Wall time of the call.")


class UndoEntryStatus(Model):
    """Where the effect and its undo stand."""

    effect: EffectState = Field(
        default="Pending",
        description="The forward effect: Pending, Executing (outcome unknown), Committed or Failed.",
    )
    state: UndoEntryState = Field(
        default="Pending",
        description="The compensation: Pending, Running, Compensated, Failed or Skipped.",
    )
    retry_count: int = Field(default=0, ge=0, description="Retries of the compensation so far.")
    last_error: str | None = Field(default=None, max_length=MAX_MESSAGE, description="Last failure, if any.")
    executed_at: datetime | None = Field(default=None, description="When the forward effect finished.")
    compensated_at: datetime | None = Field(default=None, description="When the compensation succeeded.")
    skip_reason: str | None = Field(default=None, max_length=MAX_MESSAGE, description="Why a person skipped it.")
    output: dict[str, Any] | None = Field(default=None, description="The forward call's JSON response (size-capped).")
    attempts: list[Attempt] = Field(
        default_factory=list, max_length=MAX_ATTEMPTS, description="The last calls made for this entry."
    )


class UndoEntry(Model):
    """An UndoEntry object as read from the API."""

    api_version: str = API_VERSION
    kind: str = "UndoEntry"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: UndoEntrySpec
    status: UndoEntryStatus = Field(default_factory=UndoEntryStatus)
