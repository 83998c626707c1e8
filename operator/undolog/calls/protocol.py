"""The wire protocol's headers of one attempt (pure; the keys are in undolog.conventions)."""

from __future__ import annotations

from undolog.version import __version__

USER_AGENT = f"undolog/{__version__}"
FENCE_HEADER = "Undolog-Fence"  # the sender's fencing token: higher for each new holder of the Lease
SHARD_HEADER = "Undolog-Shard"  # the shard (`<index>/<count>`) whose Lease the fence belongs to


def headers(
    *,
    idempotency_key: str,
    saga: str,
    step: str,
    org: str | None,
    attempt: int,
    forward: str | None = None,
) -> dict[str, str]:
    """Headers of one attempt. `saga` is <namespace>/<name>; `forward` is set on compensations.
    The runner adds FENCE_HEADER and SHARD_HEADER."""
    sent = {
        "Idempotency-Key": idempotency_key,
        "Undolog-Saga": saga,
        "Undolog-Step": step,
        "Undolog-Attempt": str(attempt),
        "User-Agent": USER_AGENT,
    }
    if org:
        sent["Undolog-Org"] = org
    if forward:
        sent["Undolog-Forward-Key"] = forward
    return sent
