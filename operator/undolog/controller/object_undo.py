"""Undoing a change to a Kubernetes object natively (an entry's spec.kubernetes): the object read
now, as the user the entry acts as, and what decisions/object_undo.py decides written back with
a precondition (the copy read, by uid and resourceVersion), so a change landing between the
read and the write is never overwritten: the object is read and judged again."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from undolog import errors
from undolog.api import EntryReason, EntryState, EventReason, ObjectReference, ObjectUndo, Saga, SagaPhase, UndoEntry
from undolog.api.changes import EntryStatusChange, changed
from undolog.calls.runner import Fence
from undolog.controller.guarding import halted_as_conflict
from undolog.controller.timeline import Timeline
from undolog.conventions import clip, now
from undolog.decisions import entry_changes, guards, object_undo
from undolog.kube.objects import Impersonation, Objects
from undolog.ledger import Ledger

log = logging.getLogger("undolog.operator")
READS = 5  # an object changing under every write this often is left to the driver's backoff


@dataclass
class ObjectUndoer:
    ledger: Ledger
    timeline: Timeline
    fence: Fence
    impersonation: Impersonation

    async def undo(self, saga: Saga, entry: UndoEntry, undo: ObjectUndo) -> UndoEntry:
        """The entry once its object is undone (Compensated), or why not (Failed: Conflict, or
        the API refused the user it acts as)."""
        left = entry.status.guard
        if left is None or left.after_digest is None:
            unrecorded = guards.judge(None, None)
            assert isinstance(unrecorded, guards.Conflicts)
            return await self._write(entry, self._conflict(saga, entry, unrecorded, None))
        after = left.after if isinstance(left.after, dict) else None
        objects = await self.impersonation.acting_as(undo.act_as)
        try:
            for _ in range(READS):
                self.fence.check()
                current = await objects.get(undo.object)
                plan = object_undo.undo(
                    undo.before,
                    after,
                    current,
                    undone_by=entry.spec.undo_id,
                    changes=undo.changes,
                    anyway=bool(left.overridden),
                )
                written = await self._written(saga, entry, undo, objects, plan, current)
                if written is not None:
                    return await self._write(entry, written)
        except errors.Forbidden as refused:
            return await self._write(entry, self._forbidden(saga, entry, undo, refused))
        raise errors.Unavailable(f"{undo.object} changed under each of {READS} undos in a row; trying again later")

    async def _written(
        self, saga: Saga, entry: UndoEntry, undo: ObjectUndo, objects: Objects, plan: object_undo.Undo, current: Any
    ) -> EntryStatusChange | None:
        """The entry's change once `plan` is carried out; None when the object changed between
        the read and the write (the write refused by its precondition): read it again."""
        ref = undo.object
        if isinstance(plan, object_undo.Conflict):
            return self._conflict(saga, entry, guards.Conflicts(plan.message, plan.differing), current)
        if isinstance(plan, object_undo.AlreadyUndone):
            return self._undone(saga, entry, f"{ref}: nothing to write ({plan.why})")
        self.fence.check()  # asked again just before the write: the read took a while
        try:
            said = await self._write_undo(objects, ref, plan)
        except (errors.Conflict, errors.NotFound) as moved:  # its precondition refused it
            log.info("entry %s: %s changed before the undo was written (%s); reading it again", entry.key, ref, moved)
            return None
        except errors.Invalid as refused:
            if isinstance(plan, object_undo.Restore) and await self._moved(objects, ref, current):
                return None  # its test of the resourceVersion failed: changed since the read
            return self._refused(saga, entry, f"the API refused the undo of {ref}: {refused.message}")
        return self._undone(saga, entry, said)

    @staticmethod
    async def _write_undo(objects: Objects, ref: ObjectReference, plan: object_undo.Undo) -> str:
        if isinstance(plan, object_undo.Delete):
            await objects.delete(ref, plan.uid, plan.resource_version)
            return f"{ref}: deleted (the step created it)"
        if isinstance(plan, object_undo.Create):
            await objects.create(ref, plan.manifest)
            return f"{ref}: created again as it was before the step (the step deleted it)"
        assert isinstance(plan, object_undo.Restore)
        await objects.patch(ref, plan.operations)
        return f"{ref}: {', '.join(plan.paths)} set back as before the step"

    @staticmethod
    async def _moved(objects: Objects, ref: ObjectReference, read: Any) -> bool:
        current = await objects.get(ref)
        version = (current or {}).get("metadata", {}).get("resourceVersion")
        return not isinstance(read, dict) or version != read.get("metadata", {}).get("resourceVersion")

    def _undone(self, saga: Saga, entry: UndoEntry, said: str) -> EntryStatusChange:
        self.timeline.record(
            saga, EventReason.ENTRY_COMPENSATED, f"{entry.metadata.name} (step {entry.spec.step}): {said}"
        )
        return entry_changes.compensated(now(), rewinding=saga.status.phase == SagaPhase.REWINDING)

    def _conflict(self, saga: Saga, entry: UndoEntry, judgement: guards.Conflicts, current: Any) -> EntryStatusChange:
        shown = object_undo.kept(current) if isinstance(current, dict) else current
        return halted_as_conflict(self.timeline, saga, entry, judgement, shown, undo="written")

    def _forbidden(
        self, saga: Saga, entry: UndoEntry, undo: ObjectUndo, refused: errors.Forbidden
    ) -> EntryStatusChange:
        user, ref = undo.act_as.user, undo.object
        message = (
            f"the undo acts as {user}, whom the API refused: {refused.message}; grant {user} that right on {ref} "
            f"(a Role bound to it), then `undolog retry {saga.metadata.name} -n {saga.metadata.namespace}`"
        )
        return self._refused(saga, entry, message, EntryReason.FORBIDDEN)

    def _refused(
        self, saga: Saga, entry: UndoEntry, message: str, reason: EntryReason = EntryReason.PERMANENT_FAILURE
    ) -> EntryStatusChange:
        self.timeline.record(saga, EventReason.COMPENSATION_FAILED, f"{entry.metadata.name}: {message}", warning=True)
        return {"state": EntryState.FAILED, "reason": reason, "last_error": clip(message)}

    async def _write(self, entry: UndoEntry, changes: EntryStatusChange) -> UndoEntry:
        return await self.ledger.write_entry_status(entry, changed(entry.status, changes))
