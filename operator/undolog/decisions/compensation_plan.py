"""Which UndoEntries are compensated next: the dependency order, by default strict LIFO.

An entry depends on the entries below it that its `spec.dependsOn` names (by step), or, without
`dependsOn`, on every entry below it. An entry is compensated only once every entry above it
that depends on it is settled (Compensated or Skipped; under onFailure Continue also Failed).
Without any `dependsOn` that is exactly descending stackPosition (LIFO), one at a time;
entries that do not depend on one another are compensated together (at most PARALLEL at once).

An entry is still owed a compensation while its state is Pending or Running (Running means a
call may have left before a crash: it is sent again under the same key). Its effect state
hardly matters: Executing means the outcome is unknown, and unknown is compensated; only an
effect proven NotSent (no byte of the forward call left) is settled without a call, like a step
with no compensation. The operator compensates from this plan and `undolog plan` (the read
model) shows the same plan.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

from undolog.api import Call, EffectState, EntryReason, EntryState, ObjectUndo, UndoEntry
from undolog.api.changes import changed, with_status
from undolog.decisions.stack import Stack

PARALLEL = 10  # entries of one saga compensated at once, at most

OWED = frozenset({EntryState.PENDING, EntryState.RUNNING})
SETTLED = frozenset({EntryState.COMPENSATED, EntryState.SKIPPED})
UNSETTLED = frozenset({*OWED, EntryState.FAILED})  # what a compensation still has to deal with
FAILED = frozenset({EntryState.FAILED})
FAILED_EFFECTS = frozenset({EffectState.FAILED, EffectState.NOT_SENT, EffectState.ABANDONED})  # did not commit


def call_or_skip(entry: UndoEntry) -> Call | ObjectUndo | tuple[EntryReason, str]:
    """The compensation to call for an owed entry (or its object to undo natively), or why it is
    Skipped instead: nothing to call, or nothing was ever done."""
    if entry.status.effect == EffectState.NOT_SENT:
        why = entry.status.last_error or "the forward call was refused before it was sent"
        return EntryReason.NOT_SENT, f"never sent, nothing to undo ({why})"[:1024]
    if entry.status.effect == EffectState.ABANDONED:
        why = entry.status.last_error or "its task ended without an effect"
        return EntryReason.TASK_ENDED, f"nothing to undo, by its server's word ({why})"[:1024]
    if entry.spec.kubernetes is not None:
        return entry.spec.kubernetes
    if entry.spec.compensation is None:
        return EntryReason.NO_COMPENSATION, "the step has no compensation (Pivot or Retriable)"
    return entry.spec.compensation


def owed(entries: Iterable[UndoEntry]) -> list[UndoEntry]:
    """Entries still owed a compensation, newest first: the order they are compensated in."""
    return newest_first(e for e in entries if e.status.state in OWED)


def unsettled(entries: Iterable[UndoEntry]) -> list[UndoEntry]:
    """Entries owed or Failed, newest first: what a retry of the saga would compensate, in order."""
    return newest_first(e for e in entries if e.status.state in UNSETTLED)


def newest_first(entries: Iterable[UndoEntry]) -> list[UndoEntry]:
    return sorted(entries, key=lambda e: e.spec.stack_position, reverse=True)


def declared_dependencies(entries: Iterable[UndoEntry]) -> dict[str, frozenset[str] | None]:
    """Each entry's `dependsOn` (by entry name) where it can be trusted, else None (everything
    below it): a `dependsOn` that names a step which is not below the entry is not trusted."""
    declared: dict[str, frozenset[str] | None] = {}
    below: set[str] = set()
    for entry in sorted(entries, key=lambda e: e.spec.stack_position):
        names = entry.spec.depends_on
        declared[entry.metadata.name] = frozenset(names) if names is not None and set(names) <= below else None
        below.add(entry.spec.step)
    return declared


def depends(upper: UndoEntry, lower: UndoEntry, declared: dict[str, frozenset[str] | None]) -> bool:
    """Whether `upper` must be compensated before `lower`."""
    if upper.spec.stack_position <= lower.spec.stack_position:
        return False
    names = declared.get(upper.metadata.name)
    return names is None or lower.spec.step in names


def ready(entries: Collection[UndoEntry], *, failed_blocks: bool) -> list[UndoEntry]:
    """The owed entries that may be compensated now, newest first: every entry that must go
    before each is settled (or Failed, unless `failed_blocks`: onFailure Halt)."""
    stack = Stack.of(entries)
    if not stack.declares_dependencies:
        return lifo_ready(stack, failed_blocks=failed_blocks)
    return dependency_ready(list(stack), SETTLED if failed_blocks else SETTLED | FAILED)


def dependency_ready(entries: Sequence[UndoEntry], done: frozenset[EntryState]) -> list[UndoEntry]:
    """Linear: an entry waits for the highest unsettled entry without a trusted dependsOn, and
    for the unsettled entries that name its step."""
    declared = declared_dependencies(entries)
    waits_for_all_below = -1  # position of the highest unsettled entry that depends on everything below
    named: dict[str, int] = {}  # step -> position of the highest unsettled entry that names it
    for entry in entries:
        if entry.status.state in done:
            continue
        position, names = entry.spec.stack_position, declared[entry.metadata.name]
        if names is None:
            waits_for_all_below = max(waits_for_all_below, position)
        for step in names or ():
            named[step] = max(named.get(step, -1), position)
    return [
        e
        for e in owed(entries)
        if e.spec.stack_position >= waits_for_all_below and named.get(e.spec.step, -1) <= e.spec.stack_position
    ]


def lifo_ready(stack: Stack, *, failed_blocks: bool) -> list[UndoEntry]:
    """Without any dependsOn: the highest entry not done, if it is owed (under Halt a Failed
    entry is not done and keeps everything below it waiting)."""
    top = stack.highest(UNSETTLED if failed_blocks else OWED)
    return [top] if top is not None and top.status.state in OWED else []


def waves(entries: Sequence[UndoEntry]) -> list[list[UndoEntry]]:
    """What a compensation would do from here (after a retry) if every call succeeded: the
    unsettled entries in the groups that may run together, first group first, newest first."""
    simulated = {
        e.metadata.name: with_status(e, changed(e.status, {"state": EntryState.PENDING}))
        if e.status.state == EntryState.FAILED
        else e
        for e in entries
    }
    original = {e.metadata.name: e for e in entries}
    result: list[list[UndoEntry]] = []
    while wave := ready(list(simulated.values()), failed_blocks=True):
        result.append([original[w.metadata.name] for w in wave])
        for entry in wave:
            simulated[entry.metadata.name] = with_status(
                entry, changed(entry.status, {"state": EntryState.COMPENSATED})
            )
    return result


def blocking_failure(entries: Collection[UndoEntry]) -> UndoEntry | None:
    """The highest Failed entry, which (under Halt) keeps every lower entry waiting."""
    return Stack.of(entries).highest(FAILED)


def settled_count(entries: Collection[UndoEntry]) -> int:
    """Entries compensated or skipped: the saga's compensatedCount."""
    return Stack.of(entries).count(SETTLED)


def owed_count(entries: Collection[UndoEntry]) -> int:
    return Stack.of(entries).count(OWED)
