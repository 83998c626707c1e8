"""The wire protocol's headers of one attempt (pure; the keys are in undolog.conventions)."""

from __future__ import annotations

import re

from undolog.api import EntryReason
from undolog.errors import CallNotPossible
from undolog.version import __version__

USER_AGENT = f"undolog/{__version__}"
FENCE_HEADER = "Undolog-Fence"  # the sender's fencing token: higher for each new holder of the Lease
SHARD_HEADER = "Undolog-Shard"  # the shard (`<index>/<count>`) whose Lease the fence belongs to
# Headers the operator sets itself, which a Secret may not: those that frame or address the
# request (a Content-Length would leave the rest of the body on a keep-alive connection that the
# next call to the participant reads as its answer; a Host would address another site), and the
# protocol's own (a second, differently spelled Idempotency-Key or Undolog-Fence would reach the
# participant beside the operator's).
TRANSPORT_HEADERS = frozenset(
    {"content-length", "transfer-encoding", "host", "connection", "keep-alive", "te", "trailer", "upgrade", "expect"}
    | {"content-type", "accept", "user-agent", "idempotency-key"}
    | {"webhook-id", "webhook-timestamp", "webhook-signature"}
)
PROTOCOL_PREFIX = "undolog-"
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # a header value is one line: only TAB of the controls


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


def secret_headers(secret: str, data: dict[str, bytes]) -> dict[str, str]:
    """A Webhook's headers from its Secret (`secret`: <namespace>/<name>, for the message): each
    value without surrounding whitespace (which a header value never holds, and a file ends
    with: `kubectl create secret --from-file`). CallNotPossible when one cannot be sent as is."""
    sendable = {}
    for key, raw in data.items():
        try:
            value = raw.decode().strip()
        except UnicodeDecodeError:
            problem = "is not UTF-8 text"
        else:
            if key.lower() in TRANSPORT_HEADERS or key.lower().startswith(PROTOCOL_PREFIX):
                problem = "is a header the operator sets itself: remove it"
            elif _CONTROL.search(value):
                problem = "holds a line break or another control character: a header value is one line"
            else:
                sendable[key] = value
                continue
        raise CallNotPossible(
            EntryReason.HEADERS_SECRET_INVALID, f"Secret {secret} (spec.headersFrom) key {key!r} {problem}"
        )
    return sendable
