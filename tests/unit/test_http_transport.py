"""The HTTP transport against real participants on loopback: an attempt ends at its timeout
whatever the participant sends, an answer is read only up to the cap, a refused address gets
nothing, and an answer that is not a JSON object says so."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.support.participants import Participant, Reply, https_participant
from undolog.api import EntryReason
from undolog.calls.http import CALLS_PER_PARTICIPANT, MAX_CONTEXTS, HttpTransport, certificate_rejected
from undolog.calls.transport import PreparedCall, Target
from undolog.conventions import MAX_ANSWER_BYTES
from undolog.decisions.egress import EgressPolicy
from undolog.decisions.retry import Verdict, classify
from undolog.errors import NotLeading


@pytest.fixture
async def transport() -> AsyncIterator[HttpTransport]:
    http = HttpTransport(EgressPolicy.build(allow_loopback=True))
    yield http
    await http.close()


def call(participant: Participant, path: str, timeout: float = 2.0) -> PreparedCall:
    return PreparedCall(Target(participant.url(path), timeout), {"n": 1}, {"Idempotency-Key": "k"})


async def test_a_trickling_participant_is_cut_at_the_timeout(
    participant: Participant, transport: HttpTransport
) -> None:
    participant.script("/drip", Reply(200, drip=0.2))
    began = time.monotonic()
    outcome = await transport.send(call(participant, "/drip", timeout=1.0))
    took = time.monotonic() - began
    assert outcome.error == "timed out after 1 s"
    assert 0.9 <= took < 1.5, took


async def test_an_answer_beyond_the_cap_is_not_read(participant: Participant, transport: HttpTransport) -> None:
    participant.script("/huge", Reply(200, size=16 * MAX_ANSWER_BYTES))
    outcome = await transport.send(call(participant, "/huge", timeout=10))
    assert outcome.status_code == 200  # the effect happened
    assert outcome.output is None
    assert outcome.omitted is not None
    assert outcome.omitted.reason == "AnswerTooLarge"
    assert outcome.omitted.size_bytes == 16 * MAX_ANSWER_BYTES
    # The connection was closed on the rest: the next call still works.
    assert (await transport.send(call(participant, "/next"))).status_code == 200


async def test_a_refused_address_receives_nothing(participant: Participant) -> None:
    strict = HttpTransport(EgressPolicy.build())
    try:
        outcome = await strict.send(call(participant, "/undo"))
    finally:
        await strict.close()
    assert outcome.refusal == EntryReason.TARGET_REFUSED
    assert "(denied: 127.0.0.0/8)" in (outcome.error or "")
    assert participant.received() == []


async def test_answers_that_are_not_a_json_object_say_so(participant: Participant, transport: HttpTransport) -> None:
    participant.script("/html", Reply(200, raw=b"<html>ok</html>"))
    participant.script("/list", Reply(200, body=[1, 2]))
    participant.script("/object", Reply(200, body={"user_id": "u-1"}))
    participant.script("/error", Reply(503, raw=b"x" * 10_000))
    html = await transport.send(call(participant, "/html"))
    assert html.omitted is not None
    assert html.omitted.reason == "AnswerNotJson"
    listed = await transport.send(call(participant, "/list"))
    assert listed.omitted is not None
    assert "a JSON list" in listed.omitted.message
    assert (await transport.send(call(participant, "/object"))).output == {"user_id": "u-1"}
    error = await transport.send(call(participant, "/error"))
    assert error.status_code == 503
    assert error.error is not None
    assert len(error.error) < 400
    sent = participant.received("/object")[0]
    assert sent.body == {"n": 1}
    assert sent.headers["idempotency-key"] == "k"


async def test_what_a_participant_says_of_its_answer_is_cut_to_what_the_ledger_keeps(
    participant: Participant, transport: HttpTransport
) -> None:
    """A Content-Type of 8,000 characters (aiohttp reads header lines up to 8,190) was quoted
    whole in outputOmitted's message, whose bound is 1,024: the transport raised pydantic's
    ValidationError, and the call was made again, and again, with the same answer."""
    content_type = "text/html; charset=" + "x" * 8000
    participant.script("/long", Reply(200, raw=b"<html>ok</html>", headers={"Content-Type": content_type}))
    outcome = await transport.send(call(participant, "/long"))
    assert outcome.status_code == 200
    assert outcome.omitted is not None
    assert outcome.omitted.reason == "AnswerNotJson"
    assert outcome.omitted.message.startswith(
        "HTTP 200 with an answer that is not a JSON object (text/html; charset=xxx"
    )
    assert len(outcome.omitted.message) <= 1024


async def test_an_answer_nested_deeper_than_python_parses_is_a_success_without_output(
    participant: Participant, transport: HttpTransport
) -> None:
    """100,000 levels in 600 KB: Python's json raises RecursionError past ~1,000, which left the
    transport as no outcome at all and the driver's task ended with it."""
    participant.script("/deep", Reply(200, raw=b'{"a":' * 100_000 + b"1" + b"}" * 100_000))
    outcome = await transport.send(call(participant, "/deep"))
    assert outcome.status_code == 200  # the effect happened
    assert outcome.output is None
    assert outcome.omitted is not None
    assert outcome.omitted.reason == "OutputTooDeep"
    assert outcome.omitted.message == "HTTP 200 with a JSON answer nested too deep to parse (600001 bytes): no output"


async def test_credentials_in_a_target_url_are_never_quoted_in_what_is_recorded(
    participant: Participant, transport: HttpTransport
) -> None:
    """A Webhook admitted before the CRD refused `user:password@` in URLs: its errors, which
    the entry's status and Events keep, quoted the URL whole."""
    participant.script("/undo", Reply(200))
    garbled = socket.create_server(("127.0.0.1", 0))  # answers with no HTTP status line at all

    def answer_garbage() -> None:
        connection, _ = garbled.accept()
        with connection:
            connection.recv(65536)
            connection.sendall(b"HTTQ/9 nonsense\r\n\r\n")

    threading.Thread(target=answer_garbage, daemon=True).start()
    for url, why in (
        (f"http://billing:s3cret@{'a' * 64}.test/undo", "cannot be called"),
        ("http://billing:s3cret@[::1/undo", "is not a URL the operator calls"),
        (f"http://billing:s3cret@127.0.0.1:{garbled.getsockname()[1]}/undo", "Bad status line"),
    ):
        outcome = await transport.send(PreparedCall(Target(url, 2), {"n": 1}, {"Idempotency-Key": "k"}))
        assert outcome.error is not None
        assert why in outcome.error
        assert "s3cret" not in outcome.error
        assert "billing" not in outcome.error
    legacy = participant.url("/undo").replace("://", "://billing:s3cret@")
    sent = await transport.send(PreparedCall(Target(legacy, 2), {"n": 1}, {"Idempotency-Key": "k"}))
    assert sent.status_code == 200  # still called: refused at admission only, never halted on upgrade


async def test_a_request_that_cannot_be_formed_is_refused_and_nothing_is_sent(
    participant: Participant, transport: HttpTransport
) -> None:
    """aiohttp raises ValueError for a host label over 63 characters (at name resolution) and for
    a line break in a header value: before, that left the transport as no outcome at all."""
    long_label = PreparedCall(Target(f"http://{'a' * 64}.test/undo", 2), {"n": 1}, {"Idempotency-Key": "k"})
    two_lines = PreparedCall(Target(participant.url("/undo"), 2), {"n": 1}, {"Undolog-Forward-Key": "a\nX-Injected: 1"})
    for refused, why in ((long_label, "too long"), (two_lines, "Forbidden control character")):
        outcome = await transport.send(refused)
        assert outcome.refusal == EntryReason.TARGET_REFUSED
        assert outcome.error is not None
        assert outcome.error.startswith(f"{refused.target.url!r} cannot be called: ")
        assert why in outcome.error
    assert participant.received() == []


async def test_an_answer_with_a_number_json_cannot_carry_is_a_success_without_output(
    participant: Participant, transport: HttpTransport
) -> None:
    """Python reads 1e999 as inf and NaN as nan; written back, pydantic makes them null, which
    the merge patch took as "delete the key": the output lost `amount` without a word."""
    participant.script("/huge", Reply(200, raw=b'{"id": "u-1", "amount": 1e999}'))
    participant.script("/nan", Reply(200, raw=b'{"id": "u-1", "amount": -Infinity}'))
    for path, number in (("/huge", "1e999"), ("/nan", "-Infinity")):
        outcome = await transport.send(call(participant, path))
        assert outcome.status_code == 200
        assert outcome.output is None
        assert outcome.omitted is not None
        assert outcome.omitted.reason == "AnswerNotJson"
        assert f"holding {number}, a number JSON cannot carry" in outcome.omitted.message


async def test_an_answer_with_an_integer_the_api_would_round_is_a_success_without_output(
    participant: Participant, transport: HttpTransport
) -> None:
    """The API stores an integer beyond 64 bits as a float64 (123456789012345678901234567890
    came back 1.2345678901234568e+29); 64-bit integers are kept as they are."""
    edges = b'{"max": 9223372036854775807, "min": -9223372036854775808}'
    participant.script("/edges", Reply(200, raw=edges))
    assert (await transport.send(call(participant, "/edges"))).output == {"max": 2**63 - 1, "min": -(2**63)}
    for answer, said in (
        (b'{"id": 9223372036854775808}', "holding 9223372036854775808, an integer beyond 64 bits"),
        (b'{"id": -9223372036854775809}', "holding -9223372036854775809, an integer beyond 64 bits"),
        (b'{"id": ' + b"7" * 5000 + b"}", "holding " + "7" * 40 + "…, an integer beyond 64 bits"),
    ):
        participant.script("/big", Reply(200, raw=answer))
        outcome = await transport.send(call(participant, "/big"))
        assert outcome.status_code == 200
        assert outcome.output is None
        assert outcome.omitted is not None
        assert outcome.omitted.reason == "AnswerNotJson"
        assert said in outcome.omitted.message


async def test_tls_contexts_per_ca_bundle_are_bounded(transport: HttpTransport) -> None:
    """Webhook authors choose CA bundles; each is a TLS context holding its roots."""
    import base64

    from devtools.control_plane.pki import certificate_authority

    for n in range(MAX_CONTEXTS + 8):
        bundle = base64.b64encode(certificate_authority(f"ca-{n}").certificate_pem).decode()
        transport._context(bundle, None)
    assert len(transport._contexts) == MAX_CONTEXTS


async def test_one_participant_has_at_most_its_share_of_calls_in_flight_and_others_are_not_held(
    transport: HttpTransport,
) -> None:
    """A slow participant holds CALLS_PER_PARTICIPANT calls at a time, the rest wait for a slot
    (their attempt's clock not started); a call to another participant goes at once."""
    slow, other = Participant(), Participant()
    try:
        slow.script("/slow", *[Reply(200, delay=1.5)] * (CALLS_PER_PARTICIPANT + 8))
        left: list[int] = []
        queued = replace(call(slow, "/slow", timeout=2.0), leaving=lambda: left.append(1))
        calls = [asyncio.create_task(transport.send(queued)) for _ in range(CALLS_PER_PARTICIPANT + 8)]
        await slow.until(lambda received: len(received) >= CALLS_PER_PARTICIPANT, within=5)
        assert len(slow.received("/slow")) == CALLS_PER_PARTICIPANT  # none answered yet: the rest wait
        assert len(left) == CALLS_PER_PARTICIPANT  # and are not said to have left (no in-flight clock)
        quick = await transport.send(call(other, "/fast"))
        assert quick.status_code == 200
        assert not any(c.done() for c in calls)  # not behind the slow participant's queue
        outcomes = await asyncio.gather(*calls)
        # The 8 that waited for a slot had their whole second: none timed out.
        assert [o.status_code for o in outcomes] == [200] * (CALLS_PER_PARTICIPANT + 8)
        assert len(transport.slots) == 0  # nothing kept for participants with no call in flight
    finally:
        slow.close()
        other.close()


async def test_a_redirect_is_not_followed_and_says_where_it_pointed(
    participant: Participant, transport: HttpTransport
) -> None:
    participant.script(
        "/moved", Reply(308, {"error": "moved"}, headers={"Location": "https://payments.example/v2/undo"})
    )
    outcome = await transport.send(call(participant, "/moved"))
    assert outcome.status_code == 308
    assert outcome.error == (
        "HTTP 308 to https://payments.example/v2/undo (redirects are not followed: point the Webhook there): "
        '{"error": "moved"}'
    )
    assert [r.path for r in participant.received()] == ["/moved"]  # nothing sent where it pointed


async def test_a_call_waits_for_a_slot_among_all_calls_before_its_clock_starts() -> None:
    """aiohttp's connection limit was the bound on all calls, waited for inside the attempt: a
    tenant whose slow participants held every connection made everyone else's calls time out
    (and their sagas halt, retries used up), though their participants were fine."""
    transport = HttpTransport(EgressPolicy.build(allow_loopback=True), calls_in_flight=2)
    slow = [Participant(), Participant()]  # two origins: each within its own share
    healthy = Participant()
    try:
        for participant in slow:
            participant.script("/slow", Reply(200, delay=1.5))
        held = [asyncio.create_task(transport.send(call(p, "/slow", timeout=5.0))) for p in slow]
        for participant in slow:
            await participant.until(lambda received: len(received) >= 1, within=5)
        quick = await transport.send(call(healthy, "/fast", timeout=0.5))
        assert quick.error is None
        assert quick.status_code == 200  # it waited for a slot, then had its whole half second
        assert [o.status_code for o in await asyncio.gather(*held)] == [200, 200]
    finally:
        await transport.close()
        for participant in (*slow, healthy):
            participant.close()


FIRST_CALL = """
import asyncio, json, sys
from undolog.calls.http import HttpTransport
from undolog.calls.transport import PreparedCall, Target
from undolog.decisions.egress import EgressPolicy
from undolog.decisions.retry import Verdict, classify
from undolog.decisions.retry import CallOutcome

async def main(url: str) -> None:
    transport = HttpTransport(EgressPolicy.build(allow_loopback=True))
    looked_up = []

    class Recorder:  # every import attempted, found or not (a failed one is not cached: it repeats)
        @staticmethod
        def find_spec(name, path=None, target=None):
            looked_up.append(name)

    before = set(sys.modules)
    sys.meta_path.insert(0, Recorder)
    outcome = await transport.send(PreparedCall(Target(url, 5.0), {}, {"Idempotency-Key": "k"}))
    sys.meta_path.remove(Recorder)
    await transport.close()
    imported = sorted(set(sys.modules) - before)
    print(json.dumps({"status": outcome.status_code, "imported": imported, "looked_up": sorted(set(looked_up))}))

asyncio.run(main(sys.argv[1]))
"""


async def test_a_first_call_imports_nothing(participant: Participant) -> None:
    """Imports on the first call run on the event loop, inside the first compensation after a
    start (httpcore's took ~25 ms, seen in a py-spy profile). A fresh interpreter, since this
    one has them all."""
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", FIRST_CALL, participant.url("/undo")],
        capture_output=True,
        text=True,
        check=True,
    )
    first = json.loads(done.stdout)
    assert first["status"] == 200
    assert first["imported"] == []
    assert first["looked_up"] == []  # a failed import is not cached: it would be searched for on every call


async def test_a_lease_lost_once_the_request_has_left_does_not_cut_the_call_off(participant: Participant) -> None:
    """The guard is asked once the connection is made and again just before the first byte is
    written, and not after the request has left: a call the participant already has is
    answered, not cut off."""
    asked: list[int] = []

    def guard() -> None:
        asked.append(1)
        if len(asked) > 2:  # the request sent: the Lease falls in doubt from here on
            raise NotLeading("the Lease is in doubt")

    transport = HttpTransport(EgressPolicy.build(allow_loopback=True), guard=guard)
    try:
        outcome = await transport.send(call(participant, "/undo"))
    finally:
        await transport.close()
    assert outcome.status_code == 200
    assert len(participant.received("/undo")) == 1


async def test_a_lease_lost_before_the_request_is_written_sends_nothing(participant: Participant) -> None:
    """A connection to the participant is open and idle (an earlier call); the Lease falls in
    doubt before the next call is written: NotLeading, and the participant receives nothing more."""
    leading = [True]

    def guard() -> None:
        if not leading[0]:
            raise NotLeading("the Lease is in doubt")

    transport = HttpTransport(EgressPolicy.build(allow_loopback=True), guard=guard)
    try:
        assert (await transport.send(call(participant, "/first"))).status_code == 200
        leading[0] = False
        with pytest.raises(NotLeading):
            await transport.send(call(participant, "/second"))
    finally:
        await transport.close()
    assert [r.path for r in participant.received()] == ["/first"]


async def test_a_lease_lost_between_the_request_and_its_first_byte_sends_nothing(participant: Participant) -> None:
    """aiohttp buffers the headers when the request is sent and writes them with the body from a
    task of its own, a turn of the event loop later: the Lease may be lost in between (a process
    stopped there and resumed after a hand-over). Asked again before the first byte: nothing
    leaves. Before, the guard passed once and the whole request went out."""
    asked: list[int] = []
    lost = [True]

    def guard() -> None:
        asked.append(len(asked))
        if lost[0] and len(asked) > 1:  # lost between the request and its first byte
            raise NotLeading("the Lease is in doubt")

    transport = HttpTransport(EgressPolicy.build(allow_loopback=True), guard=guard)
    try:
        with pytest.raises(NotLeading):
            await transport.send(call(participant, "/undo"))
        assert participant.received() == []
        lost[0] = False  # led again: the next call leaves whole, on a sound connection
        assert (await transport.send(call(participant, "/after"))).status_code == 200
    finally:
        await transport.close()
    assert [r.path for r in participant.received()] == ["/after"]


async def test_a_name_is_refused_on_the_address_it_resolves_to(participant: Participant) -> None:
    """localhost resolves to loopback, which this policy denies: refused before connecting."""
    strict = HttpTransport(EgressPolicy.build())
    try:
        named = PreparedCall(Target(f"http://localhost:{participant.port}/undo", 2.0), {}, {})
        outcome = await strict.send(named)
    finally:
        await strict.close()
    assert outcome.refusal == EntryReason.TARGET_REFUSED
    assert (outcome.error or "").startswith("localhost: ")
    assert "(denied: 127.0.0.0/8)" in (outcome.error or "")
    assert participant.received() == []


async def test_a_ca_bundle_that_is_not_a_certificate_refuses_the_call_and_sends_nothing(
    participant: Participant, transport: HttpTransport
) -> None:
    import base64

    garbage = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n").decode()
    target = Target(participant.url("/undo").replace("http:", "https:"), 2.0, ca_bundle=garbage)
    outcome = await transport.send(PreparedCall(target, {}, {}))
    # Refused, not a TLS failure: that would be an outage, waited out for an hour, for a Webhook to fix.
    assert outcome.refusal == EntryReason.TARGET_REFUSED
    assert (outcome.error or "").startswith("caBundle is not usable PEM: ")
    assert participant.received() == []


async def test_an_upper_case_https_scheme_is_verified_with_the_webhooks_ca_bundle(
    transport: HttpTransport, tmp_path: Path
) -> None:
    secure, bundle = https_participant(tmp_path)
    try:
        url = secure.url("/refund").replace("https://", "HTTPS://")
        outcome = await transport.send(PreparedCall(Target(url, 5.0, ca_bundle=bundle), {}, {}))
    finally:
        secure.close()
    assert outcome.status_code == 200, outcome.error
    assert [r.path for r in secure.received()] == ["/refund"]


async def test_a_target_that_is_no_url_is_refused_and_nothing_is_sent(transport: HttpTransport) -> None:
    outcome = await transport.send(PreparedCall(Target("http://[::1", 2.0), {}, {}))
    assert outcome.refusal == EntryReason.TARGET_REFUSED
    assert "is not a URL the operator calls" in (outcome.error or "")


async def test_names_whose_lookup_hangs_hold_neither_the_default_executor_nor_more_than_one_thread_each(
    participant: Participant, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Webhook author's host name whose resolver never answers (glibc tries every nameserver
    and search domain: up to a minute in a pod) held a thread of asyncio's default executor past
    its call's timeout, one per call. A few such names stalled the API client's token re-read
    (a thread of that executor, once a minute), and with it every API request and the Lease."""
    release = threading.Event()
    real = socket.getaddrinfo
    hung: list[str] = []

    def lookup(host: Any, *args: Any, **kwargs: Any) -> Any:
        if str(host).endswith(".hangs.test"):
            hung.append(str(host))
            release.wait(30)
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", lookup)
    transport = HttpTransport(EgressPolicy.build(allow_loopback=True))
    try:
        names = [f"n{i}.hangs.test" for i in range(min(32, (os.cpu_count() or 1) + 4) + 2)]  # the default's threads, +2
        hanging = [
            transport.send(PreparedCall(Target(f"http://{name}:{participant.port}/x", 0.5), {}, {}))
            for name in names
            for _ in range(3)
        ]
        assert {o.error for o in await asyncio.gather(*hanging)} == {"timed out after 0.5 s"}
        # The lookups still hang, and the rest of the process does not wait for them:
        assert await asyncio.wait_for(asyncio.to_thread(lambda: "read"), 2) == "read"
        named = PreparedCall(Target(f"http://localhost:{participant.port}/named", 2), {}, {})
        assert (await transport.send(named)).status_code == 200
        assert sorted(hung) == sorted(names)  # one lookup per name at a time, whoever asks
    finally:
        release.set()
        await transport.close()


@pytest.mark.parametrize(
    ("code", "named"),
    [(10, "expired"), (20, "unknown issuer"), (19, "unknown issuer"), (62, "name mismatch"), (9, "not yet valid")],
)
def test_a_rejected_certificate_is_named_as_a_person_fixes_it(code: int, named: str) -> None:
    error = ssl.SSLCertVerificationError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed")
    error.verify_code, error.verify_message = code, "as OpenSSL says it"
    said = certificate_rejected(error)
    assert said.startswith(named)
    assert "certificate verify failed" in said


def test_a_certificate_problem_openssl_names_alone_keeps_its_words() -> None:
    error = ssl.SSLCertVerificationError(1, "certificate verify failed: invalid CA certificate")
    error.verify_code = 24
    assert certificate_rejected(error) == str(error)


@pytest.mark.parametrize(
    ("bundle", "client", "refusal", "said"),
    [
        ("bm90IHBlbQ==", None, EntryReason.TARGET_REFUSED, "caBundle is not usable PEM"),
        (
            None,
            (b"not pem", b"not pem"),
            EntryReason.CLIENT_CERTIFICATE_INVALID,
            "spec.clientCertificate is not usable",
        ),
    ],
)
async def test_tls_material_that_is_no_pem_refuses_the_call_before_anything_is_sent(
    transport: HttpTransport, bundle: str | None, client: tuple[bytes, bytes] | None, refusal: EntryReason, said: str
) -> None:
    target = Target(url="https://127.0.0.1:9/undo", timeout_seconds=1, ca_bundle=bundle, client_certificate=client)
    outcome = await transport.send(PreparedCall(target, {}, {}))
    assert outcome.refusal == refusal
    assert said in str(outcome.error)


async def test_a_409_naming_a_conflict_is_no_retry_and_one_without_is(
    participant: Participant, transport: HttpTransport
) -> None:
    """A participant refuses the undo because the state changed since the step: a Conflict for a
    person. A bare 409 stays the Idempotency-Key draft's "still processing", retried as is."""
    participant.script("/undo", Reply(409, body={"conflict": "balance changed since the step", "now": 70}))
    said = await transport.send(call(participant, "/undo"))
    assert (said.conflict, classify(said)) == (True, Verdict.PERMANENT)
    assert "balance changed since the step" in str(said.error)
    participant.script("/undo", Reply(409, body={"detail": "in progress"}))
    busy = await transport.send(call(participant, "/undo"))
    assert (busy.conflict, classify(busy)) == (False, Verdict.TRANSIENT)
