"""A driver's writes of its saga's status: entering a phase (its conditions, counters and
Event) and progress (stackDepth, compensatedCount) at a measured pace."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime

from undolog import metrics, tracing
from undolog.api import EffectStatus, Saga, SagaPhase, SagaReason, SagaStatus, UndoEntry
from undolog.api.changes import changed
from undolog.controller.context import DriverContext
from undolog.controller.entry_proof import EntryProver
from undolog.decisions import compensation_plan, moves, phases, retention

COUNTER_INTERVAL = 5.0  # seconds between progress writes of stackDepth and compensatedCount


def traced(saga: Saga, phase: SagaPhase, reason: SagaReason) -> None:
    """The saga as one span, from its creation to this phase, in its agent's trace."""
    with tracing.span(
        f"saga {saga.reference}",
        {"undolog.saga": saga.reference, "undolog.phase": phase.value, "undolog.reason": reason.value},
        parent=saga.metadata.annotations.get(tracing.TRACEPARENT_ANNOTATION),
        start=saga.metadata.creation_timestamp,
    ):
        pass


class StatusWriter:
    __slots__ = ("context", "last_write", "namespace", "prover")

    def __init__(self, context: DriverContext, namespace: str, prover: EntryProver) -> None:
        self.context, self.namespace, self.prover = context, namespace, prover
        self.last_write = 0.0

    async def write(self, saga: Saga, status: SagaStatus) -> Saga:
        written = await self.context.ledger.write_saga_status(saga, status)
        self.last_write = self.context.clock.monotonic()
        return written

    async def enter(self, saga: Saga, entries: Collection[UndoEntry], transition: moves.Transition) -> Saga:
        """Enter a new phase: its status (conditions, counters) written, then its Event."""
        return await self.entered(saga, self.entering(saga, entries, transition), transition.phase, transition.reason)

    def entering(self, saga: Saga, entries: Collection[UndoEntry], transition: moves.Transition) -> SagaStatus:
        """The saga's status in the transition's phase."""
        phase = transition.phase
        before = saga.status
        if before.phase is None and phase != SagaPhase.ACTIVE:  # its steps ran before Active was written
            before = changed(before, {"start_time": saga.metadata.creation_timestamp})
        moment = self.context.clock.now()
        status = phases.with_phase(
            before,
            phase,
            reason=transition.reason,
            message=transition.message,
            now=moment,
            generation=saga.metadata.generation,
            expires_at=retention.expires_at(saga, phase, moment, self.context.retention),
        )
        status = with_counters(status, entries)
        if transition.failed_step:
            status = changed(status, {"failed_step": transition.failed_step})
        if transition.rewind is not None:
            status = changed(status, {"rewind": transition.rewind})
        if phase == SagaPhase.COMPLETED and not saga.spec.steps:
            # The proven top of the stack at the commit: an entry above it came later.
            top = max((e.spec.stack_position for e in entries), default=0)
            status = changed(status, {"top_position": top})
        if phase == SagaPhase.ACTIVE:
            self.prover.forget()  # a new failure needs a new proof
        return status

    async def entered(
        self, saga: Saga, status: SagaStatus, phase: SagaPhase, reason: SagaReason, *, at: datetime | None = None
    ) -> Saga:
        """Write the new phase's status (from `entering`), then post the Event (dated `at`, when
        the phase was entered, if not now)."""
        written = await self.write(saga, status)
        if phase in phases.FINAL:
            traced(written, phase, reason)
        metrics.series.of(metrics.saga_transitions, self.namespace, phase, reason).inc()
        self.context.informer.written(written)
        failed = reason in phases.FAILURE_REASONS  # the failure shares this write: say it as such
        warning = failed or phase in (SagaPhase.FAILED, SagaPhase.HALTED)
        self.context.timeline.record(
            written, SagaPhase.FAILED if failed else phase, f"{reason}: {status.message}", warning=warning, at=at
        )
        return written

    async def counted(self, saga: Saga, entries: Collection[UndoEntry]) -> Saga:
        """Refresh stackDepth and compensatedCount after an entry moved, at most once per
        COUNTER_INTERVAL: fast sagas show their counts with the next phase, slow ones show
        progress (STEPS and UNDONE in `kubectl get sagas`) while they run. A saga whose steps
        run before its first phase is written gets its counts with that phase. Not while every
        slot is taken: the operator is at its limit then (thousands of sagas resuming, each
        slow only because it shares the apiserver with the others), and a progress write per
        saga slowed them all."""
        if (
            saga.status.phase is None
            or self.context.clock.monotonic() - self.last_write < COUNTER_INTERVAL
            or self.context.slots.locked()
        ):
            return saga
        status = with_counters(saga.status, entries)
        if status == saga.status:
            return saga
        return await self.write(saga, status)


def with_counters(status: SagaStatus, entries: Collection[UndoEntry]) -> SagaStatus:
    return changed(status, {"stack_depth": len(entries), "compensated_count": compensation_plan.settled_count(entries)})


def with_effect(status: SagaStatus, delivered: EffectStatus) -> SagaStatus:
    previous = next((e for e in status.effects if e.name == delivered.name), None)
    if previous is not None:
        delivered = changed(delivered, {"attempts": previous.attempts + delivered.attempts})
    effects = [e for e in status.effects if e.name != delivered.name] + [delivered]
    return changed(status, {"effects": effects})
