"""The moves the state machine can ask for; the controller applies each with one write, one
read or one call."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from undolog.api import Effect, RewindStatus, SagaPhase, SagaReason, Step, UndoEntry


class EntryProof(StrEnum):
    """How far the entries the driver holds are known to be all of the saga's entries.

    Only a consistent listing taken after the saga failed proves it, or the entry watch once it
    has applied its stream past a revision written after that (never a guess at how far a watch
    has come). FRESH: proven since the last call was made, nothing could have been missed since.
    STALE: proven after the failure, calls made since. NONE: not proven since the failure (or the
    driver just started)."""

    NONE = "None"
    STALE = "Stale"
    FRESH = "Fresh"


@dataclass(frozen=True)
class Initialize:
    """First sight: status Active with every condition set (Unknown where not yet known)."""


@dataclass(frozen=True)
class SyncMetadata:
    """Labels and finalizer differ from what the status implies. `final`: the finalizer is
    released on a finished saga: nothing writes it again, and its field owners
    (metadata.managedFields, half of what it holds in etcd) are dropped with this write.
    `entries_too`: its entries' as well, one write each, when it is kept long enough for the
    bytes to outweigh the writes (retention.KEPT_LONG)."""

    labels: dict[str, str | None]
    finalizers: list[str]
    final: bool = False
    entries_too: bool = False


@dataclass(frozen=True)
class UpdateDepth:
    """An agent registered entries: status.stackDepth follows."""

    stack_depth: int


@dataclass(frozen=True)
class Transition:
    """Enter a phase: Failed, Compensating, Completed, Compensated, Halted, Rewinding, or Active
    again; `rewind` is the rewind's new record when it starts or ends."""

    phase: SagaPhase
    reason: SagaReason
    message: str
    failed_step: str | None = None
    rewind: RewindStatus | None = None


@dataclass(frozen=True)
class RefuseRewind:
    """Record why spec.rewind is not carried out (a Warning Event; the phase stays)."""

    rewind: RewindStatus


@dataclass(frozen=True)
class ProveEntries:
    """List the saga's entries consistently (the proof that none is missing) before going on."""


@dataclass(frozen=True)
class RecordLateEntry:
    """An entry registered after its saga Completed: a committed saga is never compensated, so
    the entry is settled (Skipped) with that reason, and a Warning says so."""

    entry: UndoEntry


@dataclass(frozen=True)
class RegisterStep:
    """Write-ahead: create the UndoEntry of an orchestrated step before its call. `again`: the
    step ran before and was rewound, so this run is a new effect (a new forward key)."""

    position: int
    step: Step
    again: bool = False


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
class CompensateEntries:
    """Compensate (or settle without a call) these entries together: the ones the dependency
    order lets go now (under strict LIFO, only the highest one owed), newest first."""

    entries: tuple[UndoEntry, ...]


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
class UndoAnyway:
    """A person says an entry halted as Conflict is compensated all the same (its guard not asked)."""

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
    | ProveEntries
    | RecordLateEntry
    | RegisterStep
    | ExecuteStep
    | MarkPivot
    | RefuseAbort
    | RefuseRewind
    | CompensateEntries
    | DeliverEffect
    | Retry
    | SkipEntry
    | UndoAnyway
    | RefuseAnnotation
    | Wait
)
