"""Builders of Saga, UndoEntry and Webhook bodies for tests."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

API = "undolog.io/v1beta1"


def call(function: str, **args: Any) -> dict[str, Any]:
    return {"function": function, "args": args}


def step(name: str, type_: str = "Compensatable", compensation: bool | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"name": name, "type": type_, "action": call(f"{name.replace('_', '-')}-do")}
    if compensation if compensation is not None else type_ == "Compensatable":
        body["compensation"] = call(f"{name.replace('_', '-')}-undo")
    return body


def saga(name: str = "order-1", steps: list[dict[str, Any]] | None = None, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"apiVersion": API, "kind": "Saga", "metadata": {"name": name}, "spec": dict(spec)}
    if steps is not None:
        body["spec"]["steps"] = steps
    return body


def timestamp(moment: datetime | None = None) -> str:
    return (moment or datetime.now(UTC)).isoformat(timespec="microseconds").replace("+00:00", "Z")


def undo_entry(
    saga_name: str = "order-1",
    position: int = 1,
    *,
    owner_uid: str | None = None,
    compensation: dict[str, Any] | None = None,
    step: str | None = None,
    **overrides: Any,
) -> dict[str, Any]:
    spec = {
        "saga": saga_name,
        "undoId": str(uuid.uuid4()),
        "stackPosition": position,
        "effectId": f"uid:step{position}:fwd",
        "step": step or f"step{position}",
        "compensation": compensation if compensation is not None else call("delete-user", user_id="u-1"),
        "registeredAt": timestamp(),
    }
    spec.update(overrides)
    metadata: dict[str, Any] = {"name": f"{saga_name}-{position}"}
    if owner_uid:
        metadata["ownerReferences"] = [
            {"apiVersion": API, "kind": "Saga", "name": saga_name, "uid": owner_uid, "blockOwnerDeletion": True}
        ]
    return {"apiVersion": API, "kind": "UndoEntry", "metadata": metadata, "spec": spec}


def webhook(name: str = "create-user", **version: Any) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "Webhook",
        "metadata": {"name": name},
        "spec": {"versions": [{"name": "v1", **(version or {"url": "http://127.0.0.1:9/create"})}]},
    }
