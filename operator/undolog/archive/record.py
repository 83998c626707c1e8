"""What the archive keeps of a finished saga: the objects as the API had them (jsonb), and the
columns history is searched by. Pure: no I/O."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from undolog.api import ConditionStatus, ConditionType, Saga, SagaPhase, UndoEntry
from undolog.api.common import revision_of


@dataclass(frozen=True)
class ArchivedEvent:
    """One Event the operator emitted about a saga or one of its entries, captured as emitted
    (Kubernetes keeps Events an hour)."""

    saga_uid: str
    sequence: int  # nanoseconds, strictly increasing: the order things happened
    at: datetime
    kind: str  # Saga or UndoEntry
    name: str  # the object's name
    reason: str
    message: str
    warning: bool


@dataclass(frozen=True)
class ArchivedSaga:
    uid: str
    namespace: str
    name: str
    phase: str
    reason: str | None
    message: str | None
    failure: str | None  # why it failed (the Succeeded condition's message), if it did
    org: str | None
    functions: list[str]  # every function its steps, entries and effects call
    failed_step: str | None
    created_at: datetime | None
    started_at: datetime | None
    finished_at: datetime
    labels: dict[str, str]
    revision: int  # the saga's resourceVersion archived
    entries_revision: int  # the newest of its entries' resourceVersions
    saga: dict[str, Any]
    entries: list[dict[str, Any]]
    events: list[ArchivedEvent] = field(default_factory=list)  # oldest first, when read back

    @property
    def key(self) -> tuple[str, str]:
        return self.namespace, self.name

    def restored(self) -> tuple[Saga, list[UndoEntry]]:
        """The saga and its entries as models again (the read model renders them as live ones)."""
        return Saga.model_validate(self.saga), [UndoEntry.model_validate(e) for e in self.entries]


def functions_of(saga: Saga, entries: Sequence[UndoEntry]) -> list[str]:
    named = {call.function for step in saga.spec.steps or [] for call in (step.action, step.compensation) if call}
    named |= {effect.call.function for effect in saga.spec.effects or []}
    named |= {e.spec.compensation.function for e in entries if e.spec.compensation}
    return sorted(named)


def archived_saga(saga: Saga, entries: Sequence[UndoEntry]) -> ArchivedSaga:
    """The archive's row of a saga in a final phase, with its entries (every attempt, output)."""
    status, meta = saga.status, saga.metadata
    finished = status.completion_time or status.start_time or meta.creation_timestamp
    assert finished is not None, "a finished saga has a completion time"
    ordered = sorted(entries, key=lambda e: e.spec.stack_position)
    return ArchivedSaga(
        uid=meta.uid,
        namespace=meta.namespace,
        name=meta.name,
        phase=(status.phase or SagaPhase.ACTIVE).value,
        reason=status.reason.value if status.reason else None,
        message=status.message,
        failure=next(
            (
                c.message
                for c in status.conditions
                if c.type == ConditionType.SUCCEEDED and c.status == ConditionStatus.FALSE
            ),
            None,
        ),
        org=saga.spec.org_id,
        functions=functions_of(saga, entries),
        failed_step=status.failed_step,
        created_at=meta.creation_timestamp,
        started_at=status.start_time,
        finished_at=finished,
        labels=dict(meta.labels),
        revision=revision_of(meta.resource_version) or 0,
        entries_revision=max((revision_of(e.metadata.resource_version) or 0 for e in entries), default=0),
        saga=saga.model_dump(mode="json", by_alias=True, exclude_none=True),
        entries=[e.model_dump(mode="json", by_alias=True, exclude_none=True) for e in ordered],
    )


@dataclass(frozen=True)
class HistoryQuery:
    """What `undolog history` and the dashboard's History view ask for; None: any."""

    namespaces: list[str] | None = None  # None: every namespace (the caller checks who may see what)
    phase: str | None = None
    org: str | None = None
    principal: str | None = None  # spec.principal: who opened it through the gateway
    function: str | None = None
    name: str | None = None
    since: datetime | None = None  # finished at or after
    until: datetime | None = None  # finished before
    text: str | None = None  # in the reason, the message or why it failed
    limit: int = 100
    before: tuple[datetime, str] | None = None  # paging: rows finished before this (time, uid)
