"""Standard Webhooks' headers as the operator signs them, checked by the library participants use."""

from __future__ import annotations

import base64
import os
from datetime import UTC, datetime

import pytest
from standardwebhooks import Webhook as Verifier
from standardwebhooks.webhooks import WebhookVerificationError

from undolog.calls.signing import key_problem, webhook_headers


def secret() -> str:
    return "whsec_" + base64.b64encode(os.urandom(24)).decode()


def test_each_key_signs_and_either_key_verifies() -> None:
    old, new = secret(), secret()
    body = b'{"user":"u-1"}'
    headers = webhook_headers("undo-42", body, [old, new], datetime.now(UTC))
    assert headers["webhook-id"] == "undo-42"
    assert len(headers["webhook-signature"].split(" ")) == 2
    for key in (old, new):
        assert Verifier(key).verify(body, headers) == {"user": "u-1"}
    with pytest.raises(WebhookVerificationError):
        Verifier(secret()).verify(body, headers)


def test_without_keys_there_is_an_id_and_a_time_and_no_signature() -> None:
    headers = webhook_headers("undo-42", b"{}", [], datetime(2026, 1, 2, tzinfo=UTC))
    assert headers == {"webhook-id": "undo-42", "webhook-timestamp": "1767312000"}


@pytest.mark.parametrize(
    ("value", "why"),
    [("hunter2", "does not start with whsec_"), ("whsec_!!!", "is not whsec_ and base64"), (secret(), None)],
    ids=["no-prefix", "not-base64", "a-new-secret"],  # the same ids in every collection (pytest-xdist)
)
def test_a_value_that_cannot_sign_is_named(value: str, why: str | None) -> None:
    problem = key_problem(value)
    assert problem is None if why is None else problem is not None and problem.startswith(why)
