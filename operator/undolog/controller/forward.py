"""Orchestrated sagas going forward: register a step's entry, send its call, send the
post-commit effects of a completed saga.

Write-ahead costs two API writes per step: the entry is created (effect Pending: registered,
maybe sent) and later set Committed with the output, or Failed. Executing is written only for
a call that is not over within a moment, for people watching; it adds nothing to recovery,
since a Pending entry is sent again under the same key just like an Executing one.

NotSent instead of Failed needs proof that no attempt ever left: the call was refused before
sending (no such function, a bad reference, a refused target) on the first execution of an
entry this operator itself just created. An entry found already registered may have been sent
by an operator that died, so a refusal then is Failed, and compensated.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from undolog import errors, metrics
from undolog.api import (
    ActAs,
    AttemptKind,
    Effect,
    EffectDeliveryState,
    EffectState,
    EffectStatus,
    EventReason,
    ObjectUndo,
    Saga,
    Step,
    StepType,
    UndoEntry,
)
from undolog.api.changes import EntryStatusChange, changed
from undolog.calls.runner import AttemptRecord, CallResult, CallTrace
from undolog.controller.recorded_call import (
    CallPlan,
    CallRecorder,
    CallRefused,
    call_trace,
    failure_changes,
    headers_for,
)
from undolog.conventions import (
    clip,
    effect_key,
    entry_name,
    forward_key,
    kept_output,
    new_undo_entry,
    now,
    owned_by,
    stable_undo_id,
)
from undolog.decisions import object_undo
from undolog.decisions.forward import EFFECT_RETRIES, FORWARD_RECOVERY_RETRIES
from undolog.decisions.principals import SERVICE_ACCOUNT_PREFIX
from undolog.decisions.retry import Verdict
from undolog.errors import CallNotPossible, StaleEntry, UndoLogError
from undolog.kube.objects import ObjectReads
from undolog.tracing import TRACEPARENT_ANNOTATION

log = logging.getLogger("undolog.operator")


class ObjectNotRead(UndoLogError):
    """A step's object could not be read before its action: nothing is registered or sent, and
    the saga says why until it can be (or a person aborts it)."""


@dataclass
class Forwarder:
    recorder: CallRecorder
    objects: ObjectReads  # the Kubernetes objects steps change (spec.steps[].kubernetes)

    async def register(self, saga: Saga, position: int, step: Step, *, again: bool = False) -> tuple[UndoEntry, bool]:
        """Create the step's entry; after a crash, the one created before is found again.
        True when this call created it (so no attempt can have been sent yet)."""
        ledger = self.recorder.ledger
        entry = new_undo_entry(
            saga,
            position,
            step.name,
            step.compensation,
            undo_id=stable_undo_id(saga.metadata.uid, position, step.name),
            depends_on=step.depends_on,
            # A step run again after a rewind is a new effect: a new forward key.
            effect_id=forward_key(saga.metadata.uid, f"{step.name}@{position}") if again else None,
            kubernetes=await self._object_before(saga, step),
        )
        try:
            return await ledger.create_entry(entry), True
        except errors.AlreadyExists:
            existing = await ledger.entry(saga.metadata.namespace, entry_name(saga.metadata.name, position))
        if not owned_by(existing, saga.metadata.uid):
            raise StaleEntry(f"UndoEntry {existing.reference} belongs to an earlier saga named {saga.metadata.name}")
        return existing, False

    async def _object_before(self, saga: Saga, step: Step) -> ObjectUndo | None:
        """The object the step's action changes, as its ServiceAccount reads it before the action."""
        if step.kubernetes is None:
            return None
        namespace = saga.metadata.namespace
        named = step.kubernetes
        act_as = ActAs(user=f"{SERVICE_ACCOUNT_PREFIX}{namespace}:{named.service_account}")
        try:
            _, ref, before = await self.objects.before(named.resource, named.namespace or namespace, named.name, act_as)
        except errors.KubeError as refused:
            raise ObjectNotRead(
                f"step {step.name}: {named.resource} {named.name} could not be read as {act_as.user} before its "
                f"action, so nothing was sent: {refused.message}"
            ) from None
        return ObjectUndo(object=ref, before=before, act_as=act_as, changes=named.changes)

    async def _object_after(self, entry: UndoEntry) -> EntryStatusChange:
        """The object right after the action, as its entry keeps it (unread: its undo halts for a person)."""
        undo = entry.spec.kubernetes
        if undo is None:
            return {}
        try:
            objects = await self.objects.impersonation.acting_as(undo.act_as)
            left = object_undo.left(await objects.get(undo.object))
        except errors.KubeError as error:
            log.warning("entry %s: %s could not be read after its action: %s", entry.key, undo.object, error.message)
            left = None
        return {"guard": left} if left is not None else {}

    async def execute(
        self,
        saga: Saga,
        entry: UndoEntry,
        step: Step,
        outputs: Mapping[str, Mapping[str, Any] | None],
        *,
        first_send: bool,
    ) -> UndoEntry:
        """Send the step's call. `first_send`: no attempt of it can have left before (the
        entry was just created here), so a refusal before sending proves NotSent."""
        plan = self._plan(saga, entry, step)
        ended = await self.recorder.call_entry(saga, entry, outputs, plan)
        if isinstance(ended, CallRefused):
            refused = ended.refused
            changes: EntryStatusChange = {
                "effect": EffectState.NOT_SENT if first_send else EffectState.FAILED,
                "executed_at": now(),
                "last_error": clip(str(refused)),
                "reason": refused.reason,
            }
        else:
            outcome = self._outcome(saga, ended.result, plan.label, first_send)
            changes = outcome | {"executed_at": now(), "attempts": ended.attempts}
        changes |= await self._object_after(ended.entry)
        return await self.recorder.ledger.write_entry_status(ended.entry, changed(ended.entry.status, changes))

    @staticmethod
    def _plan(saga: Saga, entry: UndoEntry, step: Step) -> CallPlan:
        previous, call = entry.status.attempts, step.action
        default_retries = FORWARD_RECOVERY_RETRIES if step.type == StepType.RETRIABLE else None
        return CallPlan(
            kind=AttemptKind.FORWARD,
            label=f"{entry.metadata.name} (step {step.name}, {call.function} {call.version})",
            call=call,
            key=entry.spec.effect_id,
            step=step.name,
            forward_key=None,
            backoff=saga.spec.compensation_policy.backoff,
            max_retries=call.max_retries if call.max_retries is not None else default_retries,
            first_attempt=sum(1 for a in previous if a.kind == AttemptKind.FORWARD) + 1,
            in_flight={"effect": EffectState.EXECUTING},
            already_in_flight=entry.status.effect == EffectState.EXECUTING,
            retry_reason=EventReason.FORWARD_RETRY,
            counts_retries=False,
            attempts=tuple(previous),
            trace=call_trace(saga, entry, call, AttemptKind.FORWARD, entry.spec.effect_id),
        )

    def _outcome(self, saga: Saga, result: CallResult, label: str, first_send: bool) -> EntryStatusChange:
        """The step's effect once its call is over: Committed with its output, else Failed, or
        NotSent when no attempt of a first send ever left."""
        last, timeline = result.last, self.recorder.timeline
        if result.verdict != Verdict.SUCCEEDED:
            never_left = first_send and all(a.outcome.refusal is not None for a in result.attempts)
            return {"effect": EffectState.NOT_SENT if never_left else EffectState.FAILED} | failure_changes(
                result, saga, label, EventReason.STEP_FAILED, timeline
            )
        output, kept_omitted = kept_output(last.outcome.output)
        omitted = last.outcome.omitted or kept_omitted
        note = f"; {omitted.message}" if omitted else ""
        timeline.record(
            saga, EventReason.STEP_COMMITTED, f"{label}: HTTP {last.outcome.status_code}, attempt {last.number}{note}"
        )
        return {"effect": EffectState.COMMITTED, "output": output, "output_omitted": last.outcome.omitted or omitted}

    async def deliver(
        self, saga: Saga, effect: Effect, outputs: Mapping[str, Mapping[str, Any] | None]
    ) -> EffectStatus:
        """Send one post-commit effect (at least once: retried, always under the same key)."""
        timeline = self.recorder.timeline
        call = effect.call
        label = f"effect {effect.name} ({call.function} {call.version})"
        prepared = await self.recorder.prepare(
            saga, call, outputs, label, missing_as_null=True, kind=AttemptKind.EFFECT
        )
        if isinstance(prepared, CallNotPossible):
            return EffectStatus(name=effect.name, state=EffectDeliveryState.FAILED, last_error=clip(str(prepared)))
        args, target = prepared

        async def on_attempt(record: AttemptRecord, delay: float | None) -> None:
            metrics.attempted(AttemptKind.EFFECT, saga.metadata.namespace, call.function, record)
            if delay is not None:
                timeline.record(
                    saga,
                    EventReason.EFFECT_RETRY,
                    f"{label} attempt {record.number}: {record.error}; retrying",
                    warning=True,
                )

        result = await self.recorder.runner.call(
            target,
            args,
            headers_for(saga, key=effect_key(saga.metadata.uid, effect.name), step=effect.name),
            backoff=saga.spec.compensation_policy.backoff,
            max_retries=call.max_retries if call.max_retries is not None else EFFECT_RETRIES,
            on_attempt=on_attempt,
            trace=CallTrace(
                f"effect {call.function}",
                {"undolog.saga": saga.reference, "undolog.effect": effect.name, "undolog.function": call.function},
                parent=saga.metadata.annotations.get(TRACEPARENT_ANNOTATION),
            ),
        )
        last = result.last
        if result.verdict == Verdict.SUCCEEDED:
            timeline.record(saga, EventReason.EFFECT_DELIVERED, f"{label}: HTTP {last.outcome.status_code}")
            return EffectStatus(
                name=effect.name, state=EffectDeliveryState.DELIVERED, attempts=last.number, delivered_at=now()
            )
        timeline.record(saga, EventReason.EFFECT_FAILED, f"{label}: {last.error}", warning=True)
        return EffectStatus(
            name=effect.name, state=EffectDeliveryState.FAILED, attempts=last.number, last_error=last.error
        )
