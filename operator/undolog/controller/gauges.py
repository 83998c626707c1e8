"""The saga gauges: how many sagas this replica drives, by namespace and phase, and how many are
halted, by namespace and the function they wait on. One for all the shards a replica holds;
a shard's engine takes its sagas out when it stops driving them (a standby's would count the
same sagas twice); a standby shows `undolog_leader 0`."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from undolog import metrics
from undolog.api import Saga, SagaPhase, UndoEntry
from undolog.controller.entry_index import EntryIndex, SagaKey
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


class PhaseGauges:
    """One engine's sagas in the shared gauges (a SagaConcern): each saga's phase, and the
    function it is halted on, counted while the engine leads (it is told `gone` for each when
    it stops leading)."""

    def __init__(self, gauges: SagaGauges, index: EntryIndex) -> None:
        self.gauges, self.index = gauges, index
        self.states: dict[SagaKey, State] = {}

    def seen(self, saga: Saga, *, written: bool) -> None:
        phase = saga.status.phase
        halted = phase == SagaPhase.HALTED
        state = (phase, resolutions.halted_on(saga, list(self.index.of(saga.key).values())) if halted else None)
        before = self.states.get(saga.key, (None, None))
        if before != state:
            self.gauges.moved(saga.metadata.namespace, before, state)
            self.states[saga.key] = state

    def gone(self, key: SagaKey) -> None:
        before = self.states.pop(key, None)
        if before is not None:
            self.gauges.moved(key[0], before, (None, None))

    def let_go(self, saga: Saga, entries: Sequence[UndoEntry]) -> None:
        return None


K = TypeVar("K")


def _add(counted: Counter[K], key: K, change: int) -> int:
    """The count after `change`; a zero is not kept (namespaces come and go)."""
    counted[key] += change
    if counted[key]:
        return counted[key]
    del counted[key]
    return 0
