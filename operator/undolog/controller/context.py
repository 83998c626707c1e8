"""What a saga's driver needs from the operator, in one small object (the engine builds it and
owns the drivers; a driver never reaches back into the engine)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from undolog.api import SagaPhase
from undolog.calls.runner import Fence
from undolog.controller.compensation import Compensator
from undolog.controller.entry_index import EntryIndex, SagaKey
from undolog.controller.forward import Forwarder
from undolog.controller.timeline import Timeline
from undolog.ledger import Ledger


@dataclass
class DriverContext:
    ledger: Ledger
    timeline: Timeline
    index: EntryIndex
    compensator: Compensator
    forwarder: Forwarder
    slots: asyncio.Semaphore  # sagas reconciled at once: memory and fairness with thousands of sagas
    phase_changed: Callable[[SagaKey, SagaPhase | None], None]  # for the engine's gauges
    fence: Fence  # checked before every move: a replaced leader neither writes nor calls
