"""Orchestrated sagas going forward: register a step's entry, send its call, send the
post-commit effects of a completed saga.

Write-ahead costs two API writes per step: the entry is created (effect Pending: registered,
maybe sent) and later set Committed with the output, or Failed. Executing is written only for
a call that is not over within a moment, for people watching; it adds nothing to recovery,
since a Pending entry is sent again under the same key just like an Executing one.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from undolog import metrics
from undolog.api.common import API_VERSION
from undolog.api.saga import Effect, EffectStatus, Saga, Step
from undolog.api.undo_entry import UndoEntry
from undolog.calls import protocol
from undolog.calls.runner import AttemptRecord
from undolog.controller.ledger import capped_output
from undolog.controller.recorded_call import CallRecorder, EntryCall, headers_for, now_text
from undolog.decisions.forward import EFFECT_RETRIES, FORWARD_RECOVERY_RETRIES
from undolog.kube import Body, is_conflict


class StaleEntry(RuntimeError):
    """An entry with this name belongs to an earlier saga of the same name, not yet collected."""


def undo_id(saga_uid: str, position: int, step: str) -> str:
    """Stable for this saga and step, new for a recreated saga: a re-registration after a crash
    finds the same entry, a saga created again under the same name gets new keys."""
    return str(uuid.uuid5(uuid.UUID(saga_uid), f"{position}:{step}"))


def owned_by(entry: Body, saga_uid: str) -> bool:
    owners = entry["metadata"].get("ownerReferences") or []
    return not owners or any(o.get("uid") == saga_uid for o in owners)


@dataclass
class Forwarder:
    recorder: CallRecorder

    async def register(self, saga: Saga, position: int, step: Step) -> Body:
        meta = saga.metadata
        name = f"{meta.name}-{position}"
        spec: Body = {
            "saga": meta.name,
            "undoId": undo_id(meta.uid, position, step.name),
            "stackPosition": position,
            "effectId": protocol.forward_key(meta.uid, step.name),
            "step": step.name,
            "registeredAt": datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z"),
        }
        if step.compensation is not None:
            spec["compensation"] = step.compensation.to_api()
        owner = {
            "apiVersion": API_VERSION,
            "kind": "Saga",
            "name": meta.name,
            "uid": meta.uid,
            "blockOwnerDeletion": True,
        }
        body = {
            "apiVersion": API_VERSION,
            "kind": "UndoEntry",
            "metadata": {"name": name, "ownerReferences": [owner]},
            "spec": spec,
        }
        kube = self.recorder.ledger.kube
        try:
            return await kube.create("undoentries", meta.namespace, body)
        except Exception as error:
            if not is_conflict(error):
                raise
        existing = await kube.get("undoentries", meta.namespace, name)  # registered before a crash
        if not owned_by(existing, meta.uid):
            raise StaleEntry(f"UndoEntry {meta.namespace}/{name} belongs to an earlier saga named {meta.name}")
        return existing

    async def execute(
        self, saga: Saga, saga_body: Body, entry_body: Body, step: Step, outputs: Mapping[str, Mapping[str, Any] | None]
    ) -> Body:
        ledger, timeline = self.recorder.ledger, self.recorder.timeline
        entry = UndoEntry.model_validate(entry_body)
        call = step.action
        label = f"{entry.metadata.name} (step {step.name}, {call.function} {call.version})"
        prepared = await self.recorder.prepare(
            saga, saga_body, call, outputs, label, missing_as_null=False, counter=metrics.forward_attempts
        )
        if isinstance(prepared, str):
            failed: Body = {"effect": "Failed", "executedAt": now_text(), "lastError": prepared}
            return await ledger.write_entry_status(entry_body, failed)
        args, target = prepared

        def retried(record: AttemptRecord, attempts: list[Body]) -> Body:
            return {"lastError": record.error, "attempts": attempts}

        previous = [a.to_api() for a in entry.status.attempts]
        default_retries = FORWARD_RECOVERY_RETRIES if step.type == "Retriable" else None
        spec = EntryCall(
            kind="Forward",
            label=label,
            call=call,
            target=target,
            args=args,
            headers=headers_for(saga, key=entry.spec.effect_id, step=step.name),
            backoff=saga.spec.compensation_policy.backoff,
            max_retries=call.max_retries if call.max_retries is not None else default_retries,
            first_attempt=sum(1 for a in previous if a["kind"] == "Forward") + 1,
            in_flight={"effect": "Executing"},
            already_in_flight=entry.status.effect == "Executing",
            retried=retried,
            attempts_metric=metrics.forward_attempts,
            seconds_metric=metrics.forward_seconds,
            attempts=previous,
        )
        result, entry_body = await self.recorder.run(saga_body, entry_body, spec)
        last = result.last
        changes: Body = {"executedAt": now_text(), "attempts": spec.attempts}
        if result.verdict == "Succeeded":
            timeline.record(
                saga_body, "StepCommitted", f"{label}: HTTP {last.outcome.status_code}, attempt {last.number}"
            )
            changes |= {"effect": "Committed", "output": capped_output(last.output)}
        else:
            why = "permanent failure" if result.verdict == "Permanent" else f"gave up after {last.number} attempts"
            timeline.record(saga_body, "StepFailed", f"{label}: {last.error} ({why})", warning=True)
            changes |= {"effect": "Failed", "lastError": f"{last.error} ({why})"}
        return await ledger.write_entry_status(entry_body, changes)

    async def deliver(
        self, saga: Saga, saga_body: Body, effect: Effect, outputs: Mapping[str, Mapping[str, Any] | None]
    ) -> EffectStatus:
        """Send one post-commit effect (at least once: retried, always under the same key)."""
        timeline = self.recorder.timeline
        call = effect.call
        label = f"effect {effect.name} ({call.function} {call.version})"
        prepared = await self.recorder.prepare(
            saga, saga_body, call, outputs, label, missing_as_null=True, counter=metrics.effect_attempts
        )
        if isinstance(prepared, str):
            return EffectStatus(name=effect.name, state="Failed", last_error=prepared)
        args, target = prepared

        async def on_attempt(record: AttemptRecord, delay: float | None) -> None:
            metrics.effect_attempts.labels(call.function, "succeeded" if record.error is None else "failed").inc()
            if delay is not None:
                timeline.record(
                    saga_body, "EffectRetry", f"{label} attempt {record.number}: {record.error}; retrying", warning=True
                )

        result = await self.recorder.runner.call(
            target,
            args,
            headers_for(saga, key=protocol.effect_key(saga.metadata.uid, effect.name), step=effect.name),
            backoff=saga.spec.compensation_policy.backoff,
            max_retries=call.max_retries if call.max_retries is not None else EFFECT_RETRIES,
            on_attempt=on_attempt,
        )
        last = result.last
        if result.verdict == "Succeeded":
            timeline.record(saga_body, "EffectDelivered", f"{label}: HTTP {last.outcome.status_code}")
            return EffectStatus(
                name=effect.name, state="Delivered", attempts=last.number, delivered_at=datetime.now(UTC)
            )
        timeline.record(saga_body, "EffectFailed", f"{label}: {last.error}", warning=True)
        return EffectStatus(name=effect.name, state="Failed", attempts=last.number, last_error=last.error)
