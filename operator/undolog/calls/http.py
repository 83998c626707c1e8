"""The HTTP transport: one pooled connection pool per CA bundle, bounded in time and memory,
and fenced in by the egress policy.

- An attempt ends at its target's timeoutSeconds of wall time, whatever the participant sends
  (a per-read timeout would let a participant that trickles bytes hold it open forever).
- At most MAX_ANSWER_BYTES of an answer are read; the connection is closed on the rest.
- Names are resolved here and every address is checked by the egress policy before connecting;
  the connection goes to the address that was checked (a name that resolves elsewhere the next
  time cannot slip through).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import socket
import ssl
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import anyio
import anyio.streams.tls
import anyio.to_thread
import httpcore

from undolog.api import OmittedOutput, OutputOmission
from undolog.calls.transport import PreparedCall
from undolog.conventions import MAX_ANSWER_BYTES, MAX_ERROR_TEXT
from undolog.decisions.egress import EgressPolicy
from undolog.decisions.retry import CallOutcome
from undolog.errors import CallRefusal

ERROR_BYTES = 4 * MAX_ERROR_TEXT  # of an error answer, enough for its first MAX_ERROR_TEXT characters
MAX_POOLS = 32  # connection pools kept, one per CA bundle
# Calls in flight to one participant (scheme, host and port); more wait for a slot before their
# attempt's clock starts. A slow or hostile participant then holds only its own calls, and each
# pool keeps few connections: httpcore's pool does work quadratic in its connections per request
# (a profile at 100 concurrent compensations: a third of the operator's CPU without this limit).
CALLS_PER_PARTICIPANT = 32


@dataclass
class _Slots:
    gate: asyncio.Semaphore
    users: int = 0  # calls holding or awaiting a slot: the entry goes when none is left


class ParticipantSlots:
    """At most `limit` calls in flight per origin; origins with no call in flight are forgotten,
    so memory follows the calls being made, not every participant ever called."""

    def __init__(self, limit: int = CALLS_PER_PARTICIPANT) -> None:
        self.limit = limit
        self._origins: dict[str, _Slots] = {}

    @contextlib.asynccontextmanager
    async def hold(self, url: str) -> AsyncIterator[None]:
        parts = urlsplit(url)
        origin = f"{parts.scheme}://{parts.netloc}"
        slots = self._origins.get(origin)
        if slots is None:
            slots = self._origins[origin] = _Slots(asyncio.Semaphore(self.limit))
        slots.users += 1
        try:
            async with slots.gate:
                yield
        finally:
            slots.users -= 1
            if slots.users == 0:
                del self._origins[origin]

    def __len__(self) -> int:
        return len(self._origins)


class EgressRefused(httpcore.ConnectError):
    """No address of the target may be called; nothing was sent."""


class GuardedStream(httpcore.AsyncNetworkStream):
    """A connection that asks the guard before every write: a process frozen (SIGSTOP, a long
    pause) between deciding to call and sending finds on waking that it may not send."""

    def __init__(self, inner: httpcore.AsyncNetworkStream, guard: Callable[[], None]) -> None:
        self.inner, self.guard = inner, guard

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:  # noqa: ASYNC109 (httpcore's)
        return await self.inner.read(max_bytes, timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:  # noqa: ASYNC109 (httpcore's)
        # An empty write sends nothing: h11 ends a sized body with one, after the whole request has
        # left. A guard raising there cut off a call the participant already had (sent again later).
        if buffer:
            self.guard()
        await self.inner.write(buffer, timeout)

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's signature)
    ) -> httpcore.AsyncNetworkStream:
        return GuardedStream(await self.inner.start_tls(ssl_context, server_hostname, timeout), self.guard)

    def get_extra_info(self, info: str) -> Any:
        return self.inner.get_extra_info(info)


class GuardedBackend(httpcore.AsyncNetworkBackend):
    """Resolves, checks each address against the policy, connects to an allowed one; every
    write asks the guard first."""

    def __init__(self, policy: EgressPolicy, guard: Callable[[], None]) -> None:
        self.policy, self.guard = policy, guard
        self.inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's signature)
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        resolved = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        addresses = list(dict.fromkeys(str(info[4][0]) for info in resolved))
        refusals = [self.policy.refusal(address, port) for address in addresses]
        allowed = [a for a, why in zip(addresses, refusals, strict=True) if why is None]
        if not allowed:
            raise EgressRefused(f"{host}: " + "; ".join(why for why in refusals if why))
        stream = await self.inner.connect_tcp(allowed[0], port, timeout, local_address, socket_options)
        return GuardedStream(stream, self.guard)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's signature)
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise EgressRefused("unix sockets are never called")

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)


def unguarded() -> None:
    return None


class HttpTransport:
    def __init__(
        self, policy: EgressPolicy, *, guard: Callable[[], None] = unguarded, max_connections: int = 200
    ) -> None:
        """`guard` raises to stop a write (errors.NotLeading): the Lease is checked on the wire."""
        self._backend = GuardedBackend(policy, guard)
        self._max_connections = max_connections
        # One pool per CA bundle, the least recently used closed past MAX_POOLS: Webhook authors
        # choose the bundles, and must not grow the operator's memory without bound.
        self._pools: OrderedDict[str | None, httpcore.AsyncConnectionPool] = OrderedDict()
        self._closing: set[asyncio.Task[None]] = set()
        self.slots = ParticipantSlots()
        self._pool(None)  # the system roots are loaded now, not on the first call

    @staticmethod
    async def warm_up() -> None:
        """What httpcore loads on its first call, loaded now: anyio's asyncio backend (imported
        when the first of its locks, events or cancel scopes is made) and the resolver's thread.
        That was ~25 ms on the event loop inside the first compensation after a start, and every
        saga aborted with it waited behind it."""
        anyio.Event(), anyio.Lock(), anyio.Semaphore(1)
        with anyio.CancelScope(shield=True):
            await asyncio.get_running_loop().getaddrinfo("127.0.0.1", 0, type=socket.SOCK_STREAM)

    def _pool(self, ca_bundle: str | None) -> httpcore.AsyncConnectionPool:
        pool = self._pools.get(ca_bundle)
        if pool is not None:
            self._pools.move_to_end(ca_bundle)
        else:
            while len(self._pools) >= MAX_POOLS:
                _, evicted = self._pools.popitem(last=False)
                closing = asyncio.get_event_loop().create_task(evicted.aclose())
                self._closing.add(closing)
                closing.add_done_callback(self._closing.discard)
            if ca_bundle:
                context = ssl.create_default_context(cadata=base64.b64decode(ca_bundle).decode())
            else:
                context = ssl.create_default_context()
            pool = httpcore.AsyncConnectionPool(
                ssl_context=context,
                max_connections=self._max_connections,
                max_keepalive_connections=self._max_connections,
                keepalive_expiry=30.0,
                network_backend=self._backend,
            )
            self._pools[ca_bundle] = pool
        return pool

    async def close(self) -> None:
        for pool in self._pools.values():
            await pool.aclose()
        self._pools.clear()

    async def send(self, call: PreparedCall) -> CallOutcome:
        target = call.target
        payload = json.dumps(call.body, separators=(",", ":")).encode()
        headers = {
            **target.headers,
            **call.headers,
            "Content-Type": "application/json",
            "Content-Length": str(len(payload)),
            "Accept": "application/json",
        }
        try:
            async with self.slots.hold(target.url), asyncio.timeout(target.timeout_seconds):
                call.leaving()
                return await self._exchange(call, payload, headers)
        except TimeoutError:
            return CallOutcome(error=f"timed out after {target.timeout_seconds:g} s")
        except EgressRefused as error:
            return CallOutcome(error=str(error)[:MAX_ERROR_TEXT], refusal=CallRefusal.TARGET_REFUSED)
        except httpcore.TimeoutException:
            return CallOutcome(error=f"timed out after {target.timeout_seconds:g} s")
        except ssl.SSLError as error:
            return CallOutcome(error=f"TLS: {error}"[:MAX_ERROR_TEXT])
        except (httpcore.NetworkError, httpcore.ProtocolError, httpcore.UnsupportedProtocol, OSError) as error:
            return CallOutcome(error=f"{type(error).__name__}: {error}"[:MAX_ERROR_TEXT])

    async def _exchange(self, call: PreparedCall, payload: bytes, headers: dict[str, str]) -> CallOutcome:
        extensions = {"timeout": dict.fromkeys(("connect", "read", "write", "pool"), call.target.timeout_seconds)}
        async with self._pool(call.target.ca_bundle).stream(
            "POST", call.target.url, headers=list(headers.items()), content=payload, extensions=extensions
        ) as response:
            status = response.status
            answer_headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in response.headers}
            succeeded = 200 <= status < 300
            body, complete = await _read(response, MAX_ANSWER_BYTES if succeeded else ERROR_BYTES)
        if not succeeded:
            text = body.decode(errors="replace").strip().replace("\n", " ")
            detail = f": {text[:MAX_ERROR_TEXT]}" if text else ""
            return CallOutcome(
                status_code=status, error=f"HTTP {status}{detail}", retry_after=answer_headers.get("retry-after")
            )
        if not complete:
            return CallOutcome(
                status_code=status,
                omitted=OmittedOutput(
                    reason=OutputOmission.ANSWER_TOO_LARGE,
                    message=(
                        f"HTTP {status} with an answer larger than {MAX_ANSWER_BYTES} bytes: the rest was not read "
                        "(connection closed), and there is no output"
                    ),
                    size_bytes=_length(answer_headers),
                ),
            )
        return _success(status, body, answer_headers.get("content-type", ""))


async def _read(response: httpcore.Response, limit: int) -> tuple[bytes, bool]:
    """At most `limit` bytes of the body, and whether that was all of it."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_stream():
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            return b"".join(chunks)[:limit], False
    return b"".join(chunks), True


def _length(headers: dict[str, str]) -> int | None:
    value = headers.get("content-length", "")
    return int(value) if value.isascii() and value.isdigit() else None


def _success(status: int, body: bytes, content_type: str) -> CallOutcome:
    if not body.strip():
        return CallOutcome(status_code=status)
    try:
        parsed = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        parsed = None
    if isinstance(parsed, dict):
        return CallOutcome(status_code=status, output=parsed)
    kind = f"a JSON {type(parsed).__name__}" if parsed is not None else f"{content_type or 'no content type'}"
    return CallOutcome(
        status_code=status,
        omitted=OmittedOutput(
            reason=OutputOmission.ANSWER_NOT_JSON,
            message=f"HTTP {status} with an answer that is not a JSON object ({kind}, {len(body)} bytes): no output",
            size_bytes=len(body),
        ),
    )
