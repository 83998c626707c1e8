"""Standard Webhooks' headers on every call: `webhook-id` (the call's Idempotency-Key, the same
on every attempt), `webhook-timestamp` (this attempt's time) and, when the Webhook names keys,
`webhook-signature` with one `v1` HMAC-SHA256 signature of `id.timestamp.body` per key.

Signed with the `standardwebhooks` library, the one participants verify with.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from standardwebhooks.webhooks import Webhook as Signer

ID_HEADER = "webhook-id"
TIMESTAMP_HEADER = "webhook-timestamp"
SIGNATURE_HEADER = "webhook-signature"
SECRET_PREFIX = "whsec_"


def key_problem(secret: str) -> str | None:
    """Why a Secret's value cannot sign (None: it can)."""
    if not secret.startswith(SECRET_PREFIX):
        return f"does not start with {SECRET_PREFIX} (a Standard Webhooks secret: whsec_ and base64)"
    try:
        Signer(secret)
    except Exception as error:  # the library raises binascii.Error, ValueError or its own on a bad key
        return f"is not whsec_ and base64: {type(error).__name__}"
    return None


def webhook_headers(message_id: str, payload: bytes, keys: Sequence[str], at: datetime) -> dict[str, str]:
    """The three headers of one attempt (no signature without keys)."""
    sent = {ID_HEADER: message_id, TIMESTAMP_HEADER: str(int(at.timestamp()))}
    if keys:
        text = payload.decode()
        sent[SIGNATURE_HEADER] = " ".join(Signer(key).sign(message_id, at, text) for key in keys)
    return sent
