"""The overview page's figures: the sagas by phase, the halted ones by the function they wait on
and their namespace, and the compensations of the last hour in five-minute steps. Read with two
LISTs (the sagas and the entries in view), counted by a pure function."""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from undolog.api import Saga, SagaPhase, UndoEntry
from undolog.decisions import resolutions
from undolog.ledger import Ledger

HOUR = timedelta(hours=1)
STEP = timedelta(minutes=5)
NO_FUNCTION = "(none named)"  # halted without a compensation to blame (a lost entry, a rewind)


@dataclass(frozen=True)
class Overview:
    phases: list[tuple[SagaPhase, int]]  # every phase, those that need a person first
    halted: list[tuple[str, str, int]]  # (function, namespace, sagas), most first
    compensated: list[tuple[datetime, int]]  # the last hour's entries compensated, by 5-minute step
    since: datetime  # the first step's start
    unreadable: int  # sagas the API holds that UndoLog cannot read

    @property
    def sagas(self) -> int:
        return sum(count for _, count in self.phases)

    @property
    def compensated_in_the_hour(self) -> int:
        return sum(count for _, count in self.compensated)


PHASES = [
    SagaPhase.HALTED,
    SagaPhase.FAILED,
    SagaPhase.COMPENSATING,
    SagaPhase.REWINDING,
    SagaPhase.ACTIVE,
    SagaPhase.COMPLETED,
    SagaPhase.COMPENSATED,
]


def overview_of(sagas: Sequence[Saga], entries: Sequence[UndoEntry], moment: datetime, unreadable: int = 0) -> Overview:
    """The figures at `moment`: a saga with no phase yet counts as Active (the operator has not
    taken it up); the compensations are the entries whose compensatedAt falls in the last hour."""
    phases = Counter(s.status.phase or SagaPhase.ACTIVE for s in sagas)
    by_saga: dict[tuple[str, str], list[UndoEntry]] = defaultdict(list)
    for entry in entries:
        by_saga[(entry.metadata.namespace, entry.spec.saga)].append(entry)
    halted = Counter(
        (resolutions.halted_on(s, by_saga[s.key]) or NO_FUNCTION, s.metadata.namespace)
        for s in sagas
        if s.status.phase == SagaPhase.HALTED
    )
    since = moment - HOUR
    steps = [0] * int(HOUR / STEP)
    for entry in entries:
        at = entry.status.compensated_at
        if at is not None and since <= at <= moment:
            steps[min(len(steps) - 1, int((at - since) / STEP))] += 1
    return Overview(
        [(phase, phases[phase]) for phase in PHASES],
        sorted(
            ((f, n, count) for (f, n), count in halted.items()), key=lambda h: (-h[2], h[0] == NO_FUNCTION, h[0], h[1])
        ),
        [(since + i * STEP, count) for i, count in enumerate(steps)],
        since,
        unreadable,
    )


async def read_overview(ledger: Ledger, namespace: str | None, moment: datetime) -> Overview:
    (listed, _), entries = await asyncio.gather(ledger.sagas(namespace), ledger.entries(namespace))
    sagas = [s for s in listed if isinstance(s, Saga)]
    return overview_of(sagas, entries, moment, unreadable=len(listed) - len(sagas))
