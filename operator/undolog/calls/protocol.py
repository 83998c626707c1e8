"""The wire protocol's keys and headers (pure)."""

from __future__ import annotations


def forward_key(saga_uid: str, step: str) -> str:
    return f"{saga_uid}:{step}:fwd"


def compensation_key(undo_id: str) -> str:
    return f"undo-{undo_id}"


def effect_key(saga_uid: str, effect: str) -> str:
    return f"{saga_uid}:effect:{effect}"


def headers(
    *,
    idempotency_key: str,
    saga: str,
    step: str,
    org: str | None,
    attempt: int,
    forward: str | None = None,
) -> dict[str, str]:
    """Headers of one attempt. `saga` is <namespace>/<name>; `forward` is set on compensations."""
    sent = {
        "Idempotency-Key": idempotency_key,
        "Undolog-Saga": saga,
        "Undolog-Step": step,
        "Undolog-Attempt": str(attempt),
    }
    if org:
        sent["Undolog-Org"] = org
    if forward:
        sent["Undolog-Forward-Key"] = forward
    return sent
