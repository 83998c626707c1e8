"""UndoLog: multi-step, multi-service work made undoable on Kubernetes.

The public surface is the agent SDK (`open_saga`, `undoable`, `Call`, ...; also importable
from `undolog.sdk`), the API models (`undolog.api`), the read model (`undolog.inspect`) and
the errors (`undolog.errors`). `pip install undolog` installs what the SDK needs; the operator
and the CLI are extras (`undolog[operator]`, `undolog[cli]`). Names are imported on first use,
so `import undolog.api` stays light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from undolog.version import __version__

if TYPE_CHECKING:
    from undolog.api import Call, CompensationPolicy, Saga, SagaPhase, UndoEntry
    from undolog.errors import NoSaga, NotSent, RewindNotDone, SagaEnded, UndoLogError
    from undolog.sdk import SagaRun, StepRun, current_saga, current_step, open_saga, undoable

_PUBLIC = {
    "Call": "undolog.api",
    "CompensationPolicy": "undolog.api",
    "Saga": "undolog.api",
    "SagaPhase": "undolog.api",
    "UndoEntry": "undolog.api",
    "NoSaga": "undolog.errors",
    "NotSent": "undolog.errors",
    "RewindNotDone": "undolog.errors",
    "SagaEnded": "undolog.errors",
    "UndoLogError": "undolog.errors",
    "SagaRun": "undolog.sdk",
    "StepRun": "undolog.sdk",
    "current_saga": "undolog.sdk",
    "current_step": "undolog.sdk",
    "open_saga": "undolog.sdk",
    "undoable": "undolog.sdk",
}

__all__ = [
    "Call",
    "CompensationPolicy",
    "NoSaga",
    "NotSent",
    "RewindNotDone",
    "Saga",
    "SagaEnded",
    "SagaPhase",
    "SagaRun",
    "StepRun",
    "UndoEntry",
    "UndoLogError",
    "__version__",
    "current_saga",
    "current_step",
    "open_saga",
    "undoable",
]


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'undolog' has no attribute {name!r}")
