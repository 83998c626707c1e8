"""A Webhook's headers from its Secret, as they are sent: values come as bytes and may end with
a file's newline; what cannot be one header line, or frames the request, is refused by name
before anything is sent (aiohttp raised ValueError on a newline, which was no outcome)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from undolog.api import EntryReason
from undolog.calls.protocol import TRANSPORT_HEADERS, secret_headers
from undolog.errors import CallNotPossible


def test_values_are_sent_without_surrounding_whitespace() -> None:
    data = {"Authorization": b"Bearer t0ken\n", "X-Tenant": b"  acme\t", "X-Name": "Zoë".encode()}
    assert secret_headers("ns/auth", data) == {"Authorization": "Bearer t0ken", "X-Tenant": "acme", "X-Name": "Zoë"}


@pytest.mark.parametrize(
    ("data", "why"),
    [
        ({"Authorization": b"Bearer a\r\nX-Injected: 1"}, "key 'Authorization' holds a line break or another control"),
        ({"X-Raw": b"\xff\xfe"}, "key 'X-Raw' is not UTF-8 text"),
        ({"content-length": b"5"}, "key 'content-length' is a header the operator sets itself"),
        ({"Host": b"elsewhere.example"}, "key 'Host' is a header the operator sets itself"),
        ({"idempotency-key": b"mine"}, "key 'idempotency-key' is a header the operator sets itself"),
        ({"undolog-fence": b"99"}, "key 'undolog-fence' is a header the operator sets itself"),
    ],
)
def test_a_value_that_cannot_be_sent_as_one_header_is_refused_by_secret_and_key(
    data: dict[str, bytes], why: str
) -> None:
    with pytest.raises(CallNotPossible) as refused:
        secret_headers("ns/auth", data)
    assert refused.value.reason == EntryReason.HEADERS_SECRET_INVALID
    assert refused.value.message.startswith(f"Secret ns/auth (spec.headersFrom) {why}")


def sendable(key: str, raw: bytes) -> bool:
    """The reference: a UTF-8 value that, stripped, is one line, under a key the transport does not set."""
    try:
        value = raw.decode().strip()
    except UnicodeDecodeError:
        return False
    one_line = all(c == "\t" or (ord(c) >= 0x20 and ord(c) != 0x7F) for c in value)
    return one_line and key.lower() not in TRANSPORT_HEADERS and not key.lower().startswith("undolog-")


KEYS = st.sampled_from(["Authorization", "X-Tenant", "Host", "Content-Length", "x.trace_id", "Undolog-Fence"])
VALUES = st.binary(max_size=12) | st.text(max_size=12).map(str.encode)


@given(st.dictionaries(KEYS, VALUES, max_size=3))
def test_a_secret_is_sent_exactly_when_every_value_is_one_header_line(data: dict[str, bytes]) -> None:
    expected = all(sendable(key, raw) for key, raw in data.items())
    try:
        sent = secret_headers("ns/auth", data)
    except CallNotPossible:
        assert not expected
        return
    assert expected
    assert sent == {key: raw.decode().strip() for key, raw in data.items()}
