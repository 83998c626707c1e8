"""What applying one move works with: the driver's parts, and the saga and entries it decided on."""

from __future__ import annotations

from dataclasses import dataclass

from undolog.api import Saga
from undolog.controller.context import DriverContext
from undolog.controller.entry_losses import EntryLosses
from undolog.controller.entry_proof import EntryProver
from undolog.controller.saga_status import StatusWriter
from undolog.decisions.stack import Outputs, Stack


@dataclass(frozen=True, slots=True)
class Turn:
    context: DriverContext
    status: StatusWriter
    prover: EntryProver
    losses: EntryLosses
    never_sent: set[str]  # entries this driver created and has not yet sent
    saga: Saga
    entries: Stack

    @property
    def outputs(self) -> Outputs:
        return self.entries.outputs()
