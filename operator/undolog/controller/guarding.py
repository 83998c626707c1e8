"""The guard of an entry's compensation: what the step left, read again just before the undo
(decisions/guards.py judges it). The read is a call of its own, made and retried as any call
(an outage of its participant is waited out as for the compensation); it writes nothing when
the state still holds, so a guard costs the compensation one read."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from undolog.api import AttemptKind, EntryReason, EntryState, EventReason, Guard, Saga, UndoEntry
from undolog.api.changes import EntryStatusChange
from undolog.controller.recorded_call import CallPlan, CallRecorder, CallRefused, call_trace, failure_changes
from undolog.controller.timeline import Timeline
from undolog.conventions import clip, now
from undolog.decisions import guard_expressions, guards, resolutions
from undolog.decisions.retry import Verdict


def halted_as_conflict(
    timeline: Timeline, saga: Saga, entry: UndoEntry, judgement: guards.Conflicts, seen: Any, *, undo: str
) -> EntryStatusChange:
    """An entry whose undo would overwrite a later change, not `undo` (sent, written): Failed as
    Conflict with what was seen now and the ways out, and a Warning Event saying so."""
    label = f"{entry.metadata.name} (step {entry.spec.step})"
    message = f"{judgement.message}; its undo was not {undo}, so the later change is kept"
    timeline.record(saga, EventReason.CONFLICT, f"{label}: {message}", warning=True)
    way_out = resolutions.how_to_resolve_conflict(saga, entry)
    return {
        "state": EntryState.FAILED,
        "reason": EntryReason.CONFLICT,
        "last_error": clip(f"{message}. {way_out}"),
        "guard": guards.conflicted(entry.status.guard, seen, judgement, now()),
    }


@dataclass(frozen=True)
class NotUndone:
    """The compensation is not sent: the entry as last written, and what it becomes."""

    entry: UndoEntry
    changes: EntryStatusChange


@dataclass
class Guarding:
    recorder: CallRecorder

    async def check(
        self, saga: Saga, entry: UndoEntry, outputs: Mapping[str, Mapping[str, Any] | None], undo: CallPlan
    ) -> UndoEntry | NotUndone:
        """The entry (as last written) when its compensation (`undo`) may go: it has no guard, a
        person said undo anyway, or what the step left still holds; else why not."""
        guard = entry.spec.guard
        if guard is None or (entry.status.guard is not None and entry.status.guard.overridden):
            return entry
        if guard.holds is not None:
            try:
                guard_expressions.check(guard.holds)
            except guard_expressions.ExpressionError as error:  # nothing to compare with: not read at all
                said = f"its guard cannot be checked: spec.guard.holds does not compile ({error})"
                return NotUndone(entry, self._conflict(saga, entry, guards.Conflicts(said, []), None))
        plan = self._plan(saga, entry, guard, undo)
        ended = await self.recorder.call_entry(saga, entry, outputs, plan)
        if isinstance(ended, CallRefused):
            why = f"what the step left could not be read ({guard.read.function}): {ended.refused}"
            failed: EntryStatusChange = {"reason": ended.refused.reason, "last_error": clip(why)}
            return NotUndone(ended.entry, {"state": EntryState.FAILED} | failed)
        result = ended.result
        if result.verdict != Verdict.SUCCEEDED:
            failed = failure_changes(result, saga, plan.label, EventReason.COMPENSATION_FAILED, self.recorder.timeline)
            return NotUndone(ended.entry, {"state": EntryState.FAILED, "attempts": ended.attempts} | failed)
        state = result.last.outcome.state
        try:
            seen = guard_expressions.selected(guard.holds, state, guard.args)
        except guard_expressions.ExpressionError as error:  # the state no longer has what the step left (deleted?)
            judgement: guards.Judgement = guards.Conflicts(f"what the step left is no longer there: {error}", [])
            seen = state
        else:
            judgement = guards.judge(ended.entry.status.guard, seen)
        if isinstance(judgement, guards.Holds):
            return ended.entry
        return NotUndone(ended.entry, self._conflict(saga, ended.entry, judgement, seen) | {"attempts": ended.attempts})

    def _conflict(self, saga: Saga, entry: UndoEntry, judgement: guards.Conflicts, seen: Any) -> EntryStatusChange:
        return halted_as_conflict(self.recorder.timeline, saga, entry, judgement, seen, undo="sent")

    @staticmethod
    def _plan(saga: Saga, entry: UndoEntry, guard: Guard, undo: CallPlan) -> CallPlan:
        """The read, made as its compensation would be (backoff, patience, in-flight mark), but
        counted apart: attempts from 1, the entry's retryCount left to the compensation."""
        # A key of its own each time: a participant that replays answers by key would give a
        # person's retry the state read before they mended it.
        key = f"guard-{uuid.uuid4()}"
        call = guard.read
        return replace(
            undo,
            kind=AttemptKind.GUARD,
            label=f"{entry.metadata.name} (step {entry.spec.step}, guard read {call.function} {call.version})",
            call=call,
            key=key,
            forward_key=None,
            max_retries=call.max_retries,
            first_attempt=1,
            counts_retries=False,
            trace=call_trace(saga, entry, call, AttemptKind.GUARD, key),
        )
