"""The moves the state machine can ask for; the controller applies each with one write or call."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from undolog.api.saga import Effect, SagaPhase, Step
from undolog.api.undo_entry import UndoEntry


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
class Transition:
    """Enter a phase: Failed, Compensating, Completed, Compensated, Halted, or Active again."""

    phase: SagaPhase
    reason: str
    message: str
    failed_step: str | None = None


@dataclass(frozen=True)
class RegisterStep:
    """Write-ahead: create the UndoEntry of an orchestrated step before its call."""

    position: int
    step: Step


@dataclass(frozen=True)
class ExecuteStep:
    """Send (or send again, under the same key) a registered step's forward call."""

    entry: UndoEntry
    step: Step


@dataclass(frozen=True)
class MarkPivot:
    """The Pivot step committed: record it, so an Abort from now on is refused at admission."""


@dataclass(frozen=True)
class RefuseAbort:
    """Abort arrived after the pivot committed: say so and go on forward."""

    message: str


@dataclass(frozen=True)
class CompensateEntry:
    """Compensate (or skip, when it has no compensation) this entry, the highest one owed."""

    entry: UndoEntry


@dataclass(frozen=True)
class DeliverEffect:
    """The saga completed: send one post-commit effect."""

    effect: Effect


@dataclass(frozen=True)
class Retry:
    """A person asked to retry: Failed entries (or failed effects) go back to Pending."""

    request: str
    resume: SagaPhase  # Compensating, Active (forward recovery) or Completed (effects)


@dataclass(frozen=True)
class SkipEntry:
    """A person marked an entry of a Halted saga Skipped."""

    entry: UndoEntry
    reason: str
    resume: SagaPhase


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
    | Transition
    | RegisterStep
    | ExecuteStep
    | MarkPivot
    | RefuseAbort
    | CompensateEntry
    | DeliverEffect
    | Retry
    | SkipEntry
    | RefuseAnnotation
    | Wait
)
