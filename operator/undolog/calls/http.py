"""The HTTP transport: participants called over one aiohttp session, bounded in time and
memory, and fenced in by the egress policy.

- An attempt ends at its target's timeoutSeconds of wall time, whatever the participant sends
  (a per-read timeout would let a participant that trickles bytes hold it open forever).
- At most MAX_ANSWER_BYTES of an answer are read; the connection is closed on the rest.
- Names are resolved here and every address is checked by the egress policy before connecting;
  the connection goes to an address that was checked (a name that resolves elsewhere the next
  time cannot slip through). An address written in the URL is checked as it is.
- The Lease is asked once the connection is made, just before the request is written.

aiohttp, not httpcore: ten calls at once took httpcore's pool 20-30 ms to send on this machine
and aiohttp's 6-10, and at 100 sagas compensating httpcore was 29% of the operator's CPU.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import json
import math
import socket
import ssl
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver, AbstractStreamWriter, ResolveResult
from yarl import URL

from undolog.api import EntryReason, OmittedOutput, OutputOmission
from undolog.api.common import INT64_MAX, INT64_MIN
from undolog.api.undo_entry import MAX_OMISSION_MESSAGE
from undolog.calls.signing import webhook_headers
from undolog.calls.transport import PreparedCall, Target
from undolog.conventions import MAX_ANSWER_BYTES, MAX_ERROR_TEXT, clip, now, shown_url
from undolog.decisions.egress import EgressPolicy
from undolog.decisions.outage import DEFAULT_IN_FLIGHT
from undolog.decisions.retry import CallOutcome, Verdict, names_conflict
from undolog.errors import NotLeading
from undolog.tls import load_certificate_chain

ERROR_BYTES = 4 * MAX_ERROR_TEXT  # of an error answer, enough for its first MAX_ERROR_TEXT characters
READ_CHUNK = 64 * 1024
MAX_CONTEXTS = 32  # TLS contexts kept, one per CA bundle (each holds its roots)
# Calls in flight to one participant (scheme, host and port); more wait for a slot before their
# attempt's clock starts. A slow or hostile participant then holds only its own calls and
# connections, never all of them.
CALLS_PER_PARTICIPANT = DEFAULT_IN_FLIGHT
CALLS_IN_FLIGHT = 200  # to all participants at once (each a connection)
DNS_THREADS = 64  # lookups at once, each of another name (more than asyncio's default executor has)


@dataclass
class _Slots:
    gate: asyncio.Semaphore
    users: int = 0  # calls holding or awaiting a slot: the entry goes when none is left


class ParticipantSlots:
    """At most `limit` calls in flight per origin, and `total` in all; origins with no call in
    flight are forgotten, so memory follows the calls being made, not every participant ever
    called. Both are waited for before an attempt's clock starts: the total was aiohttp's
    connection limit, waited for inside the attempt, so a tenant whose slow participants held
    every connection made the others' calls time out, and their sagas halt."""

    def __init__(self, limit: int = CALLS_PER_PARTICIPANT, total: int = CALLS_IN_FLIGHT) -> None:
        self.limit = limit
        self._total = asyncio.Semaphore(total)
        self._origins: dict[str, _Slots] = {}

    @contextlib.asynccontextmanager
    async def hold(self, url: str) -> AsyncIterator[None]:
        """A slot for a call to `url`'s origin, and one among all calls. A call waiting for
        them keeps its saga's slot: given back, each freed slot let another saga in, which
        then waited too, and 1,000 sagas queued on one participant took 150 MiB instead of 97
        (make bench's scale run) and longer. So 200 sagas queued on one slow participant make
        sagas that call others wait for a slot (not time out: their clock has not started)."""
        parts = urlsplit(url)
        origin = f"{parts.scheme}://{parts.netloc}"
        slots = self._origins.get(origin)
        if slots is None:
            slots = self._origins[origin] = _Slots(asyncio.Semaphore(self.limit))
        slots.users += 1
        try:
            async with slots.gate, self._total:
                yield
        finally:
            slots.users -= 1
            if slots.users == 0:
                del self._origins[origin]

    def __len__(self) -> int:
        return len(self._origins)


class EgressRefused(OSError):
    """No address of the target may be called; nothing was sent."""


Resolved = list[tuple[Any, Any, int, str, Any]]  # what getaddrinfo returns


class Lookups:
    """getaddrinfo in threads of the transport's own, one lookup per name at a time whoever asks.

    A lookup cannot be cut off: a name whose resolver never answers (glibc tries every nameserver
    and search domain, up to a minute in a pod) holds its thread past the call's timeout. In
    asyncio's default executor (6 threads on 2 cores) a few such names, chosen by any Webhook's
    author, stalled everything else run there: the API client's token re-read, and with it every
    API request and the Lease. Here they hold at most one thread per name, of these."""

    def __init__(self, threads: int = DNS_THREADS) -> None:
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="undolog-dns")
        self._pending: dict[tuple[str, int, int], asyncio.Future[Resolved]] = {}

    async def __call__(self, host: str, port: int, family: int) -> Resolved:
        key = (host, port, family)
        pending = self._pending.get(key)
        if pending is None:
            lookup = functools.partial(socket.getaddrinfo, host, port, family, socket.SOCK_STREAM)
            pending = self._pending[key] = asyncio.get_running_loop().run_in_executor(self._pool, lookup)
            pending.add_done_callback(functools.partial(self._done, key))
        return await asyncio.shield(pending)  # a call that times out leaves the lookup to the others

    def _done(self, key: tuple[str, int, int], lookup: asyncio.Future[Resolved]) -> None:
        if self._pending.get(key) is lookup:
            del self._pending[key]
        if not lookup.cancelled():
            lookup.exception()  # retrieved: its callers (if any are left) have it

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class PolicyResolver(AbstractResolver):
    """Resolves a name and keeps the addresses the egress policy allows: aiohttp connects to
    one of those, or to none."""

    def __init__(self, policy: EgressPolicy, lookups: Lookups) -> None:
        self.policy = policy
        self.lookups = lookups

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        resolved = await self.lookups(host, port, family)
        allowed: dict[str, ResolveResult] = {}
        refusals: dict[str, None] = {}
        for found_family, _, proto, _, address in resolved:
            ip = str(address[0])
            why = self.policy.refusal(ip, port)
            if why is not None:
                refusals[why] = None
            else:
                allowed.setdefault(
                    ip,
                    ResolveResult(
                        hostname=host,
                        host=ip,
                        port=port,
                        family=found_family,
                        proto=proto,
                        flags=socket.AI_NUMERICHOST | socket.AI_NUMERICSERV,
                    ),
                )
        if not allowed:
            raise EgressRefused(f"{host}: " + "; ".join(refusals))
        return list(allowed.values())

    async def close(self) -> None:
        return None


def guarded(guard: Callable[[], None]) -> type[aiohttp.ClientRequest]:
    """aiohttp's request, asking `guard` once its connection is made and again just before its
    first byte is written: a process frozen (SIGSTOP, a long pause) between deciding to call and
    sending finds on waking that it may not send. Not asked again once the request has left.

    Twice, because aiohttp (3.10 on) buffers the headers in `send` and writes them with the body
    in a task of its own, which on Python 3.11 starts on a later turn of the event loop: a
    process stopped between the two sent, once resumed, a call it no longer led for (seen in
    `make test`: its headers read 2 ms after the resume, 5.3 s after the stop)."""

    class GuardedRequest(aiohttp.ClientRequest):
        async def send(self, conn: aiohttp.connector.Connection) -> aiohttp.ClientResponse:
            guard()
            return await super().send(conn)

        async def write_bytes(
            self, writer: AbstractStreamWriter, conn: aiohttp.connector.Connection, content_length: int | None = None
        ) -> None:
            try:
                guard()
            except NotLeading as refused:  # nothing written: the response's reader raises it
                assert conn.protocol is not None
                conn.protocol.set_exception(refused)
                return
            await super().write_bytes(writer, conn, content_length)

    return GuardedRequest


def unguarded() -> None:
    return None


def _written_address(url: URL) -> str | None:
    """The host of `url` when it is an address, which aiohttp connects to without resolving
    (its own test: a colon, or digits and dots)."""
    host = url.raw_host or ""
    return host if ":" in host or host.replace(".", "").isdigit() else None


# OpenSSL's X509_V_ERR_* codes, as a person renewing or reissuing the certificate reads them.
CERTIFICATE_PROBLEMS = {
    9: "not yet valid",
    10: "expired",
    2: "unknown issuer",
    18: "unknown issuer (self-signed)",
    19: "unknown issuer (a self-signed CA in its chain)",
    20: "unknown issuer",
    21: "unknown issuer",
    62: "name mismatch",
    64: "name mismatch (IP address)",
}


def certificate_rejected(error: BaseException) -> str:
    """Which of expired, unknown issuer, name mismatch (or what OpenSSL said)."""
    code = getattr(error, "verify_code", None)
    said = str(error)
    problem = CERTIFICATE_PROBLEMS.get(code) if isinstance(code, int) else None
    return f"{problem}: {said}" if problem else said


class HttpTransport:
    def __init__(
        self, policy: EgressPolicy, *, guard: Callable[[], None] = unguarded, calls_in_flight: int = CALLS_IN_FLIGHT
    ) -> None:
        """`guard` raises to stop a write (errors.NotLeading): the Lease is checked on the wire."""
        self.policy = policy
        # One TLS context per CA bundle and client certificate, the least recently used dropped past
        # MAX_CONTEXTS: Webhook authors choose them, and must not grow the operator's memory without bound.
        self._contexts: OrderedDict[tuple[str | None, tuple[bytes, bytes] | None], ssl.SSLContext] = OrderedDict()
        self._context(None, None)  # the system roots are loaded now, not on the first call
        self._lookups = Lookups()
        connector = aiohttp.TCPConnector(
            limit=0,  # bounded by the slots, waited for before an attempt's clock starts
            resolver=PolicyResolver(policy, self._lookups),
            use_dns_cache=False,
            keepalive_timeout=30.0,
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            request_class=guarded(guard),
            cookie_jar=aiohttp.DummyCookieJar(),  # a participant's cookies never reach another call
            auto_decompress=False,  # what is read is what the cap counts
            skip_auto_headers=("Accept-Encoding", "User-Agent"),
            timeout=aiohttp.ClientTimeout(total=None),  # the attempt's own timeout bounds it
            trust_env=False,  # no proxy from the environment, no .netrc lookup per call
        )
        self.slots = ParticipantSlots(total=calls_in_flight)

    def _context(self, ca_bundle: str | None, client: tuple[bytes, bytes] | None) -> ssl.SSLContext:
        """The TLS context of a CA bundle and a client certificate; ssl.SSLError or ValueError
        when either is no PEM (decided before anything is sent)."""
        key = (ca_bundle, client)  # the certificate itself: two that hash alike must never share a context
        context = self._contexts.get(key)
        if context is not None:
            self._contexts.move_to_end(key)
            return context
        while len(self._contexts) >= MAX_CONTEXTS:
            self._contexts.popitem(last=False)
        if ca_bundle:
            context = ssl.create_default_context(cadata=base64.b64decode(ca_bundle).decode())
        else:
            context = ssl.create_default_context()
        if client:
            load_certificate_chain(context, *client)
        self._contexts[key] = context
        return context

    def _tls(self, target: Target) -> ssl.SSLContext | CallOutcome:
        """The target's TLS context, or the refusal of a CA bundle or client certificate that is
        no usable PEM (nothing is sent: the same every time)."""
        try:
            return self._context(target.ca_bundle, target.client_certificate)
        except (ssl.SSLError, ValueError) as error:
            if target.client_certificate:
                what, refusal = "caBundle or spec.clientCertificate", EntryReason.CLIENT_CERTIFICATE_INVALID
            else:
                what, refusal = "caBundle", EntryReason.TARGET_REFUSED
            return CallOutcome(error=f"{what} is not usable PEM: {error}"[:MAX_ERROR_TEXT], refusal=refusal)

    async def close(self) -> None:
        await self._session.close()
        self._lookups.close()

    def admitted(self, target: Target) -> ssl.SSLContext | bool | CallOutcome:
        """The TLS context to call `target` with (True: plain http), or why it is refused before
        anything is sent: no URL, an address the egress policy refuses, no usable PEM."""
        try:
            url = URL(target.url)
        except ValueError as error:
            return CallOutcome(
                error=f"{shown_url(target.url)!r} is not a URL the operator calls: {error}"[:MAX_ERROR_TEXT],
                refusal=EntryReason.TARGET_REFUSED,
            )
        written = _written_address(url)
        refused = None if written is None else self.policy.refusal(written, url.port or 0)
        if refused is not None:
            return CallOutcome(error=refused[:MAX_ERROR_TEXT], refusal=EntryReason.TARGET_REFUSED)
        return self._tls(target) if url.scheme == "https" else True

    def failure(self, error: BaseException, target: Target) -> CallOutcome:
        """What an exception of an attempt says: the network's doing, or a refusal (nothing sent)."""
        if isinstance(error, TimeoutError):
            return CallOutcome(error=f"timed out after {target.timeout_seconds:g} s")
        if isinstance(error, aiohttp.ClientConnectorCertificateError):
            why = certificate_rejected(error.certificate_error)
            text = f"TLS: the participant's certificate was rejected: {why}"
            return CallOutcome(error=text[:MAX_ERROR_TEXT], certificate=why[:MAX_ERROR_TEXT])
        if isinstance(error, (aiohttp.ClientSSLError, ssl.SSLError)):  # a handshake
            return CallOutcome(error=f"TLS: {error}"[:MAX_ERROR_TEXT])
        if isinstance(error, aiohttp.ClientConnectorError) and isinstance(error.os_error, EgressRefused):
            return CallOutcome(error=str(error.os_error)[:MAX_ERROR_TEXT], refusal=EntryReason.TARGET_REFUSED)
        if isinstance(error, aiohttp.InvalidURL):
            return CallOutcome(
                error=f"{shown_url(str(error.url))} is not a URL the operator calls"[:MAX_ERROR_TEXT],
                refusal=EntryReason.TARGET_REFUSED,
            )
        return CallOutcome(error=f"{type(error).__name__}: {error}"[:MAX_ERROR_TEXT])

    async def request(
        self, method: str, url: URL, payload: bytes, headers: dict[str, str], context: ssl.SSLContext | bool
    ) -> aiohttp.ClientResponse:
        """One request over the fenced session (egress-checked names, the Lease asked on the wire)."""
        return await self._session.request(
            method, url, data=payload, headers=headers, ssl=context, allow_redirects=False
        )

    async def send(self, call: PreparedCall) -> CallOutcome:
        target = call.target
        payload = json.dumps(call.body, separators=(",", ":")).encode()
        headers = {
            **target.headers,
            **call.headers,
            **webhook_headers(call.headers.get("Idempotency-Key", ""), payload, target.signing_keys, now()),
            "Content-Type": "application/json",
            "Accept": "application/json",
        }
        context = self.admitted(target)
        if isinstance(context, CallOutcome):
            return context
        try:
            async with self.slots.hold(target.url), asyncio.timeout(target.timeout_seconds):
                call.leaving()
                return await self._exchange(call, URL(target.url), payload, headers, context)
        except (TimeoutError, aiohttp.ClientError, OSError) as error:
            return self.failure(error, target)

    async def _exchange(
        self, call: PreparedCall, url: URL, payload: bytes, headers: dict[str, str], context: ssl.SSLContext | bool
    ) -> CallOutcome:
        try:
            # The scheme as parsed (lower case): HTTPS:// is https too, verified with its CA bundle.
            response = await self.request("POST", url, payload, headers, context)
        except (aiohttp.ClientSSLError, ssl.SSLError):
            raise  # some are ValueErrors too, and a handshake is no request aiohttp could not form
        except ValueError as error:
            # aiohttp cannot form the request (a host label over 63 characters, a control character
            # in a header value): raised before any byte is written, and the same every time. Only
            # here: once an answer came back, the participant may have acted on the call.
            return CallOutcome(
                error=f"{shown_url(call.target.url)!r} cannot be called: {type(error).__name__}: {error}"[
                    :MAX_ERROR_TEXT
                ],
                refusal=EntryReason.TARGET_REFUSED,
            )
        async with response:
            status = response.status
            answer_headers = {k.lower(): v for k, v in response.headers.items()}
            succeeded = 200 <= status < 300
            body, complete = await _read(response, MAX_ANSWER_BYTES if succeeded else ERROR_BYTES)
            if not complete:
                response.close()  # the rest is never read: the connection goes with it
        if not succeeded:
            text = body.decode(errors="replace").strip().replace("\n", " ")
            detail = f": {text[:MAX_ERROR_TEXT]}" if text else ""
            if 300 <= status < 400:  # the person fixing it needs where it pointed
                where = clip(answer_headers.get("location", "nowhere"), MAX_ERROR_TEXT)
                detail = f" to {where} (redirects are not followed: point the Webhook there){detail}"
            if names_conflict(status, body):
                return CallOutcome(
                    status_code=status, error=f"HTTP 409 conflict{detail}", verdict=Verdict.PERMANENT, conflict=True
                )
            return CallOutcome(
                status_code=status, error=f"HTTP {status}{detail}", retry_after=answer_headers.get("retry-after")
            )
        if not complete:
            return _without_output(
                status,
                OutputOmission.ANSWER_TOO_LARGE,
                f"an answer larger than {MAX_ANSWER_BYTES} bytes: the rest was not read (connection closed), and "
                "there is no output",
                _length(answer_headers),
            )
        return success(status, body, answer_headers.get("content-type", ""))


async def _read(response: aiohttp.ClientResponse, limit: int) -> tuple[bytes, bool]:
    """At most `limit` bytes of the body, and whether that was all of it."""
    chunks: list[bytes] = []
    size = 0
    while chunk := await response.content.read(READ_CHUNK):
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            return b"".join(chunks)[:limit], False
    return b"".join(chunks), True


class _NotCarried(ValueError):
    """A number Python reads that would not come back from the ledger as it was: written back
    `Infinity` or `NaN` would be null (pydantic), which a merge patch takes as "delete the
    key"; an integer beyond 64 bits the API stores as a float64, rounded."""


def _finite(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):  # 1e999: valid JSON, inf to Python
        raise _NotCarried(f"{text[:40]}, a number JSON cannot carry")
    return number


def _int64(text: str) -> int:
    if len(text) > 20:  # longer than any 64-bit integer: not parsed (Python refuses past 4,300 digits)
        raise _NotCarried(
            f"{text[:40]}{'…' if len(text) > 40 else ''}, an integer beyond 64 bits the API stores rounded"
        )
    number = int(text)
    if not INT64_MIN <= number <= INT64_MAX:
        raise _NotCarried(f"{text}, an integer beyond 64 bits the API stores rounded")
    return number


def _not_a_number(text: str) -> Any:
    raise _NotCarried(f"{text}, a number JSON cannot carry")  # NaN, Infinity: Python's extensions, not JSON


def _length(headers: dict[str, str]) -> int | None:
    value = headers.get("content-length", "")
    return int(value) if value.isascii() and value.isdigit() else None


def success(status: int, body: bytes, content_type: str) -> CallOutcome:
    """A 2xx answer's body as the call's output: a JSON object the ledger carries as it is."""
    if not body.strip():
        return CallOutcome(status_code=status)
    try:
        parsed = json.loads(body, parse_float=_finite, parse_int=_int64, parse_constant=_not_a_number)
    except _NotCarried as number:
        return _without_output(
            status, OutputOmission.ANSWER_NOT_JSON, f"a JSON answer holding {number}: no output", len(body)
        )
    except (ValueError, UnicodeDecodeError):
        parsed = None
    except RecursionError:  # deeper than Python parses; the ledger keeps MAX_NESTING levels at most
        return _without_output(
            status,
            OutputOmission.OUTPUT_TOO_DEEP,
            f"a JSON answer nested too deep to parse ({len(body)} bytes): no output",
            len(body),
        )
    if isinstance(parsed, dict):
        return CallOutcome(status_code=status, output=parsed, state=parsed)
    kind = f"a JSON {type(parsed).__name__}" if parsed is not None else f"{content_type or 'no content type'}"
    return _without_output(
        status,
        OutputOmission.ANSWER_NOT_JSON,
        f"an answer that is not a JSON object ({kind}, {len(body)} bytes): no output",
        len(body),
    )


def _without_output(status: int, reason: OutputOmission, what: str, size: int | None) -> CallOutcome:
    """A successful call whose answer is not kept as its output: `what` came back, and why (cut
    to its field's bound: it may quote the participant's Content-Type)."""
    message = clip(f"HTTP {status} with {what}", MAX_OMISSION_MESSAGE)
    return CallOutcome(status_code=status, omitted=OmittedOutput(reason=reason, message=message, size_bytes=size))
