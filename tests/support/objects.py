"""Typed Sagas and UndoEntries for unit tests, as the API would return them."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from undolog.api import UndoEntry

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def entry_body(
    saga: str,
    position: int,
    *,
    namespace: str = "ns",
    rv: int = 1,
    state: str = "Pending",
    effect: str = "Committed",
    compensation: dict[str, Any] | None = None,
    owner_uid: str | None = None,
    step: str | None = None,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": f"{saga}-{position}", "namespace": namespace, "resourceVersion": str(rv)}
    if owner_uid:
        metadata["ownerReferences"] = [
            {"apiVersion": "undolog.io/v1beta1", "kind": "Saga", "name": saga, "uid": owner_uid}
        ]
    return {
        "apiVersion": "undolog.io/v1beta1",
        "kind": "UndoEntry",
        "metadata": metadata,
        "spec": {
            "saga": saga,
            "undoId": str(uuid.uuid4()),
            "stackPosition": position,
            "effectId": f"uid:step{position}:fwd",
            "step": step or f"step{position}",
            "compensation": compensation or {"function": "undo", "args": {"n": position}},
            "registeredAt": NOW.isoformat(),
        },
        "status": {"state": state, "effect": effect},
    }


def entry(saga: str, position: int, **fields: Any) -> UndoEntry:
    return UndoEntry.model_validate(entry_body(saga, position, **fields))
