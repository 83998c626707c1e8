"""Typed changes of the operator's state: a TypedDict of each status model's own fields, so
mypy checks every key and value of a change (pydantic's `model_copy(update=...)` checks
neither: a misspelled key was kept silently). `changed` applies one, `with_status` puts a new
status on its object; tests/unit/test_house_rules.py keeps each TypedDict's keys its model's
fields."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, TypedDict, TypeVar, overload

from pydantic import BaseModel, JsonValue

from undolog.api.common import Condition, ConditionStatus, JsonObject
from undolog.api.saga import (
    EffectDeliveryState,
    EffectStatus,
    LostEntry,
    RewindState,
    RewindStatus,
    Saga,
    SagaPhase,
    SagaReason,
    SagaStatus,
)
from undolog.api.undo_entry import (
    Attempt,
    EffectState,
    EntryReason,
    EntryState,
    EntryTask,
    GuardStatus,
    OmittedOutput,
    UndoEntry,
    UndoEntryStatus,
)

M = TypeVar("M", bound=BaseModel)


class EntryStatusChange(TypedDict, total=False):
    effect: EffectState
    state: EntryState
    retry_count: int
    last_error: str | None
    reason: EntryReason | None
    executed_at: datetime | None
    compensated_at: datetime | None
    rewound_at: datetime | None
    skip_reason: str | None
    output: JsonObject | None
    output_omitted: OmittedOutput | None
    attempts: list[Attempt]
    guard: GuardStatus | None
    task: EntryTask | None


class GuardStatusChange(TypedDict, total=False):
    after: JsonValue
    after_digest: str | None
    now: JsonValue
    differing: list[str]
    checked_at: datetime | None
    overridden: str | None


class ConditionChange(TypedDict, total=False):
    type: str
    status: ConditionStatus
    reason: str
    message: str
    last_transition_time: datetime | None
    observed_generation: int | None


class SagaStatusChange(TypedDict, total=False):
    phase: SagaPhase | None
    conditions: list[Condition]
    failed_step: str | None
    reason: SagaReason | None
    message: str | None
    stack_depth: int
    top_position: int | None
    pivot_committed: bool | None
    effects: list[EffectStatus]
    rewind: RewindStatus | None
    lost_entries: list[LostEntry]
    unowned_entries: list[str]
    lost_entries_omitted: int
    compensated_count: int
    start_time: datetime | None
    completion_time: datetime | None
    expires_at: datetime | None
    observed_generation: int | None


class EffectStatusChange(TypedDict, total=False):
    name: str
    state: EffectDeliveryState
    attempts: int
    last_error: str | None
    delivered_at: datetime | None


class RewindStatusChange(TypedDict, total=False):
    to_position: int
    reason: str
    state: RewindState
    message: str | None
    undone: int
    started_at: datetime | None
    finished_at: datetime | None


class LostEntryChange(TypedDict, total=False):
    name: str
    stack_position: int | None
    step: str | None
    function: str | None
    why: str
    acknowledged: bool


CHANGES: dict[type[BaseModel], type[Mapping[str, Any]]] = {
    UndoEntryStatus: EntryStatusChange,
    SagaStatus: SagaStatusChange,
    EffectStatus: EffectStatusChange,
    RewindStatus: RewindStatusChange,
    LostEntry: LostEntryChange,
    Condition: ConditionChange,
    GuardStatus: GuardStatusChange,
}


@overload
def changed(model: UndoEntryStatus, change: EntryStatusChange) -> UndoEntryStatus: ...
@overload
def changed(model: SagaStatus, change: SagaStatusChange) -> SagaStatus: ...
@overload
def changed(model: EffectStatus, change: EffectStatusChange) -> EffectStatus: ...
@overload
def changed(model: RewindStatus, change: RewindStatusChange) -> RewindStatus: ...
@overload
def changed(model: LostEntry, change: LostEntryChange) -> LostEntry: ...
@overload
def changed(model: Condition, change: ConditionChange) -> Condition: ...
@overload
def changed(model: GuardStatus, change: GuardStatusChange) -> GuardStatus: ...
def changed(model: M, change: Mapping[str, Any]) -> M:
    """`model` with `change` applied (a copy; the model is left as it was)."""
    return model.model_copy(update=change)


@overload
def with_status(resource: Saga, status: SagaStatus) -> Saga: ...
@overload
def with_status(resource: UndoEntry, status: UndoEntryStatus) -> UndoEntry: ...
def with_status(resource: Saga | UndoEntry, status: SagaStatus | UndoEntryStatus) -> Saga | UndoEntry:
    """The object with this status (a copy), as a write of it would leave it."""
    return resource.model_copy(update={"status": status})
