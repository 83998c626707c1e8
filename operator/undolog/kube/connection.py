"""The API over HTTP as one user: credentials, pooled sessions, and the one exchange that turns
every refusal and broken connection into an `undolog.errors.KubeError`."""

from __future__ import annotations

import contextlib
import functools
import json
import ssl
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import quote

import aiohttp
from multidict import CIMultiDict

from undolog import errors
from undolog.conventions import CLUSTER_CLOCK
from undolog.kube.decoding import decoded
from undolog.kube.kubeconfig import Credentials, ExecCredential, TokenSource, ssl_context

JSON = "application/json"
POOL_SIZE = 100  # connections to the apiserver at most; more concurrent requests wait for one
WATCH_LINE_BYTES = 2**21  # a watch event is one line; objects reach 1.5 MiB in etcd


@dataclass(frozen=True)
class Timeouts:
    """Every client-side bound on the API, for this client and for kopf's."""

    request: float = 75  # above the apiserver's own 60 s: a silent connection must not hang a saga
    watch: int = 300  # the apiserver ends a watch after this long...
    watch_client: int = 330  # ...and the client gives up a little later (a stream gone silent)
    connect: float = 10


TIMEOUTS = Timeouts()

_ERRORS: dict[int, type[errors.KubeError]] = {
    400: errors.Invalid,
    401: errors.Unauthorized,
    403: errors.Forbidden,
    404: errors.NotFound,
    409: errors.Conflict,
    410: errors.Gone,
    422: errors.Invalid,
    429: errors.Unavailable,
}


def status_error(code: int, status: object, fallback: str = "") -> errors.KubeError:
    """The KubeError an apiserver Status (a refusal's body, or a watch's ERROR event) stands for,
    with the apiserver's own message (it names the object and the field) and its details."""
    message, reason, details = fallback or f"HTTP {code}", "", None
    if isinstance(status, dict):
        message = str(status.get("message") or message)
        reason = str(status.get("reason") or "")
        details = status_details(status.get("details"))
    kind = _ERRORS.get(code, errors.Unavailable)
    if kind is errors.Conflict and reason == "AlreadyExists":
        kind = errors.AlreadyExists
    return kind(message, status=code, reason=reason, details=details)


def status_details(details: object) -> errors.StatusDetails | None:
    """A Status's `details` (kind, name, group, causes), as far as it is well formed."""
    if not isinstance(details, dict):
        return None
    causes = tuple(
        errors.StatusCause(str(c.get("message") or ""), str(c.get("field") or ""), str(c.get("reason") or ""))
        for c in details.get("causes") or ()
        if isinstance(c, dict)
    )
    text = {key: str(details.get(key) or "") for key in ("kind", "name", "group")}
    return errors.StatusDetails(**text, causes=causes)


def as_kube_error(error: BaseException) -> errors.KubeError | None:
    """The KubeError a transport exception stands for; None for anything else."""
    if isinstance(error, errors.KubeError):
        return error
    if isinstance(error, aiohttp.ClientConnectorError):  # its own text ends in the TLS context's repr
        return errors.Unavailable(f"the API at {error.host}:{error.port} could not be reached: {error.os_error}")
    if isinstance(error, (aiohttp.ClientError, TimeoutError, OSError)):
        return errors.Unavailable(f"the API could not be reached: {error or type(error).__name__}")
    return None


@contextlib.contextmanager
def mapped() -> Iterator[None]:
    """Transport exceptions raised inside become KubeErrors."""
    try:
        yield
    except errors.KubeError:
        raise
    except Exception as error:
        kube_error = as_kube_error(error)
        if kube_error is None:
            raise
        raise kube_error from error


def _clock_seen(date: str | None, sent: float, received: float) -> None:
    """The API server's clock from an answer's `Date` (whole seconds, somewhere in the second it
    names, written between `sent` and `received`): an answer that took a second or more tells
    too little to be counted."""
    if date is None or received - sent >= 1.0:
        return
    named = _date_seconds(date)
    if named is not None:
        CLUSTER_CLOCK.observe(named + 0.5 - (sent + received) / 2)


@functools.lru_cache(maxsize=4)
def _date_seconds(date: str) -> float | None:
    """An HTTP date as a POSIX time; the answers of one second share it, so it is parsed once."""
    try:
        named = parsedate_to_datetime(date)
    except (TypeError, ValueError):
        return None
    return (named if named.tzinfo else named.replace(tzinfo=UTC)).timestamp()


class Connection:
    """One pooled aiohttp session for requests and one for watches, made on first use (so that
    a client can be built outside the event loop), with the user's credentials."""

    __slots__ = ("_session", "_tls", "_tokens", "_watch_session", "credentials", "timeouts")

    def __init__(self, credentials: Credentials, timeouts: Timeouts, tokens: TokenSource | None = None) -> None:
        self.credentials, self.timeouts = credentials, timeouts
        self._tokens = tokens or TokenSource(credentials)
        self._session: aiohttp.ClientSession | None = None
        # Watches hold their connection for minutes: over the requests' pool, 34 watched namespaces
        # (3 watches each) took all of its 100 connections and every request waited for good.
        self._watch_session: aiohttp.ClientSession | None = None
        self._tls: tuple[ExecCredential | None, ssl.SSLContext] | None = None

    @property
    def server(self) -> str:
        return self.credentials.server

    def apart(self) -> Connection:
        """The same user (the same tokens) over sessions of its own."""
        return Connection(self.credentials, self.timeouts, self._tokens)

    async def fresh_credentials(self) -> tuple[str | None, ExecCredential | None]:
        self._tokens.forget()
        return await self._tokens.token(), await self._tokens.issued()

    async def close(self) -> None:
        for session in (self._session, self._watch_session):
            if session is not None:
                await session.close()
        self._session = self._watch_session = None

    def _http(self, watching: bool = False) -> aiohttp.ClientSession:
        """The requests' pool (POOL_SIZE connections), or the watches' (one connection each, as
        many as the process runs watches: their number is set by what it watches)."""
        if watching:
            self._watch_session = self._watch_session or self._new_session(limit=0)
            return self._watch_session
        self._session = self._session or self._new_session(limit=POOL_SIZE)
        return self._session

    def _new_session(self, limit: int) -> aiohttp.ClientSession:
        impersonation = CIMultiDict[str]()
        if self.credentials.as_user:
            impersonation.add("Impersonate-User", self.credentials.as_user)
        for group in self.credentials.as_groups:  # several headers of one name
            impersonation.add("Impersonate-Group", group)
        if self.credentials.as_uid:
            impersonation.add("Impersonate-Uid", self.credentials.as_uid)
        for key, value in self.credentials.as_extra:  # the key percent-encoded, as client-go sends it
            impersonation.add(f"Impersonate-Extra-{quote(key, safe='')}", value)
        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=limit),
            trust_env=False,  # no .netrc or proxy lookups per request
            read_bufsize=WATCH_LINE_BYTES,
            headers=impersonation,
        )

    async def authorization(self) -> tuple[dict[str, str], ssl.SSLContext]:
        """The bearer header (if any) and the TLS context for the next request; the context is
        built again only when an exec plugin issued a new client certificate."""
        issued = await self._tokens.issued()
        if self._tls is None or self._tls[0] is not issued:
            self._tls = (issued, ssl_context(self.credentials, issued))
        token = await self._tokens.token()
        return ({"Authorization": f"Bearer {token}"} if token else {}), self._tls[1]

    @contextlib.asynccontextmanager
    async def exchange(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        body: Any = None,
        content_type: str = JSON,
        accept: str = JSON,
        bound: aiohttp.ClientTimeout | None = None,
        watching: bool = False,
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """One request, its refusal raised as a KubeError; a 401 is tried once more with the
        credentials read again (a rotated token file, an expired exec credential)."""
        data = None if body is None else json.dumps(body)
        # sock_connect, not connect: aiohttp's connect timeout also counts the wait for one of the
        # pool's connections, which under load is queueing, not an unreachable API.
        bound = bound or aiohttp.ClientTimeout(total=self.timeouts.request, sock_connect=self.timeouts.connect)
        for attempt in (1, 2):
            headers, tls = await self.authorization()
            generation = self._tokens.generation
            headers["Accept"] = accept
            if data is not None:
                headers["Content-Type"] = content_type
            sent = time.time()
            with mapped():
                async with self._http(watching).request(
                    method,
                    self.server + path,
                    params=params,
                    data=data,
                    headers=headers,
                    ssl=tls,
                    server_hostname=self.credentials.tls_server_name,
                    timeout=bound,
                ) as response:
                    _clock_seen(response.headers.get("Date"), sent, time.time())
                    if response.status == 401 and attempt == 1:
                        self._tokens.forget(generation)
                        continue
                    if response.status >= 400:
                        raw = await response.read()
                        raise status_error(response.status, decoded(raw), raw.decode(errors="replace")[:200])
                    yield response
                    return
