"""The saga gauges: how many sagas this replica drives, by namespace and phase, and how many are
halted, by namespace and the function they wait on. One for all the shards a replica holds;
a shard's informer takes its sagas out when it stops driving them (a standby's would count the
same sagas twice); a standby shows `undolog_leader 0`."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TypeVar

from undolog import metrics
from undolog.api import Saga, SagaPhase
from undolog.controller.entry_index import EntryIndex, SagaKey
from undolog.controller.shard_handler import ShardHandler
from undolog.decisions import resolutions

State = tuple[SagaPhase | None, str | None]  # a saga's phase, and the function it is halted on


@dataclass
class SagaGauges:
    by_phase: Counter[tuple[str, SagaPhase]] = field(default_factory=Counter)
    halted: Counter[tuple[str, str]] = field(default_factory=Counter)
    sagas: Counter[str] = field(default_factory=Counter)  # by namespace: while any, its series stay

    def moved(self, namespace: str, before: State, after: State) -> None:
        """One saga went from `before` to `after` (None phases: not counted)."""
        for (phase, function), change in ((before, -1), (after, 1)):
            if phase is None:
                continue
            _add(self.sagas, namespace, change)
            count = _add(self.by_phase, (namespace, phase), change)
            metrics.series.of(metrics.sagas_by_phase, namespace, phase).set(count)
            if phase == SagaPhase.HALTED:
                key = (namespace, function or "")
                metrics.series.of(metrics.halted_sagas, *key).set(_add(self.halted, key, change))

    def busy(self, namespace: str) -> bool:
        return self.sagas[namespace] > 0


class PhaseGauges(ShardHandler):
    """One shard's sagas in the shared gauges (subscribed to its informer): each saga's phase,
    and the function it is halted on, counted while the shard is led (it is told each saga is
    gone when it is no longer)."""

    def __init__(self, gauges: SagaGauges, index: EntryIndex) -> None:
        self.gauges, self.index = gauges, index
        self.states: dict[SagaKey, State] = {}

    def saga_seen(self, saga: Saga, *, written: bool) -> None:
        phase = saga.status.phase
        halted = phase == SagaPhase.HALTED
        state = (phase, resolutions.halted_on(saga, list(self.index.of(saga.key).values())) if halted else None)
        before = self.states.get(saga.key, (None, None))
        if before != state:
            self.gauges.moved(saga.metadata.namespace, before, state)
            self.states[saga.key] = state

    def saga_gone(self, key: SagaKey) -> None:
        before = self.states.pop(key, None)
        if before is not None:
            self.gauges.moved(key[0], before, (None, None))


K = TypeVar("K")


def _add(counted: Counter[K], key: K, change: int) -> int:
    """The count after `change`; a zero is not kept (namespaces come and go)."""
    counted[key] += change
    if counted[key]:
        return counted[key]
    del counted[key]
    return 0
