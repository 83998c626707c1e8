"""The one client of the Kubernetes API: UndoLog's kinds, Events, Secrets, Leases.

Everything that talks to the API (operator, SDK, CLI, tests) goes through here, so content
types, timeouts and errors are decided in one place: refusals and broken connections become
`undolog.errors.KubeError`s here and nowhere else.

Plain JSON over aiohttp, not a generated client: the generated one (kubernetes_asyncio) costs
72 MiB to import, which kopf imports too whenever it is installed, and a model round trip per
request; UndoLog reads and writes dicts and parses its own kinds once, in `undolog.ledger`.
"""

from __future__ import annotations

import base64
import builtins
import contextlib
import functools
import json
import os
import ssl
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import aiohttp
from multidict import CIMultiDict

from undolog import errors
from undolog.api import GROUP, VERSION
from undolog.api.common import Plural
from undolog.conventions import CLUSTER_CLOCK, MAX_EVENT_MESSAGE, now
from undolog.kube.decoding import decoded
from undolog.kube.kubeconfig import (
    Credentials,
    ExecCredential,
    TokenSource,
    credentials,
    ssl_context,
)

Body = dict[str, Any]
JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
POOL_SIZE = 100  # connections to the apiserver at most; more concurrent requests wait for one
WATCH_LINE_BYTES = 2**21  # a watch event is one line; objects reach 1.5 MiB in etcd


@dataclass(frozen=True)
class EventRecord:
    """A core/v1 Event about an object, as the timeline shows it."""

    time: datetime | None
    type: str
    reason: str
    message: str
    name: str


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
    401: errors.Forbidden,
    403: errors.Forbidden,
    404: errors.NotFound,
    409: errors.Conflict,
    410: errors.Gone,
    422: errors.Invalid,
    429: errors.Unavailable,
}


def status_error(code: int, status: object, fallback: str = "") -> errors.KubeError:
    """The KubeError an apiserver Status (a refusal's body, or a watch's ERROR event) stands for,
    with the apiserver's own message: it names the object and the field."""
    message, reason = fallback or f"HTTP {code}", ""
    if isinstance(status, dict):
        message = str(status.get("message") or message)
        reason = str(status.get("reason") or "")
    kind = _ERRORS.get(code, errors.Unavailable)
    if kind is errors.Conflict and reason == "AlreadyExists":
        kind = errors.AlreadyExists
    return kind(message, status=code, reason=reason)


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


def trimmed(body: Body) -> Body:
    """An object without metadata.managedFields: often half its size, never read by UndoLog
    (kubectl hides them too)."""
    body.get("metadata", {}).pop("managedFields", None)
    return body


def _custom_path(plural: Plural, namespace: str | None, name: str | None = None, subresource: str = "") -> str:
    path = f"/apis/{GROUP}/{VERSION}" + (f"/namespaces/{namespace}" if namespace else "") + f"/{plural}"
    return path + (f"/{name}" if name else "") + (f"/{subresource}" if subresource else "")


def _leases(namespace: str, name: str | None = None) -> str:
    return f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases" + (f"/{name}" if name else "")


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


def _event_times(when: datetime) -> tuple[str, str]:
    """An Event's Time (seconds) and MicroTime, as the API writes them."""
    utc = when.astimezone(UTC)
    return utc.strftime("%Y-%m-%dT%H:%M:%SZ"), utc.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parsed_time(value: object) -> datetime | None:
    return datetime.fromisoformat(value) if isinstance(value, str) and value else None


@dataclass
class Kube:
    """The API as one user: JSON bodies over one pooled aiohttp session (made on first use, so
    that a client can be built outside the event loop)."""

    credentials: Credentials
    timeouts: Timeouts = TIMEOUTS
    _tokens: TokenSource = field(init=False)
    _session: aiohttp.ClientSession | None = field(default=None, init=False)
    # Watches hold their connection for minutes: over the requests' pool, 34 watched namespaces
    # (3 watches each) took all of its 100 connections and every request waited for good.
    _watch_session: aiohttp.ClientSession | None = field(default=None, init=False)
    _tls: tuple[ExecCredential | None, ssl.SSLContext] | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self._tokens = TokenSource(self.credentials)

    @classmethod
    async def connect(
        cls,
        kubeconfig: str | None = None,
        context: str | None = None,
        *,
        as_user: str | None = None,
        as_groups: Sequence[str] = (),
    ) -> Kube:
        """From the given kubeconfig (or KUBECONFIG), else the in-cluster service account;
        `as_user`/`as_groups` impersonate as kubectl's --as/--as-group do (the API checks that
        the real user may impersonate, and then checks the impersonated one's RBAC). A
        kubeconfig that cannot be used is errors.KubeconfigInvalid here, before any request."""
        kube = cls(credentials(kubeconfig, context, as_user=as_user, as_groups=as_groups))
        await kube._authorization()
        return kube

    @classmethod
    def with_token(cls, server: str, ca_file: str | None, token: str) -> Kube:
        """As whoever `token` belongs to (a person's bearer token, as a dashboard receives it),
        never this process's own service account."""
        return cls(Credentials(server=server.rstrip("/"), ca_file=ca_file, token=token, source="a bearer token"))

    @property
    def server(self) -> str:
        return self.credentials.server

    def apart(self) -> Kube:
        """The same user over a pool of connections of its own: Lease renewals never wait for one
        of the connections the sagas' requests hold (at 10,000 sagas every renewal came late, and
        a holder whose renewal is late sends nothing until the next)."""
        other = Kube(self.credentials, self.timeouts)
        other._tokens = self._tokens
        return other

    async def fresh_credentials(self) -> tuple[str | None, ExecCredential | None]:
        """The bearer token and the exec plugin's credential, read or issued again: kopf logs in
        with exactly these, at start and when its own expired or were refused."""
        self._tokens.forget()
        return await self._tokens.token(), await self._tokens.issued()

    async def close(self) -> None:
        for session in (self._session, self._watch_session):
            if session is not None:
                await session.close()
        self._session = self._watch_session = None

    async def __aenter__(self) -> Kube:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    # -- the HTTP exchange ---------------------------------------------------------------------

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
        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=limit),
            trust_env=False,  # no .netrc or proxy lookups per request
            read_bufsize=WATCH_LINE_BYTES,
            headers=impersonation,
        )

    async def _authorization(self) -> tuple[dict[str, str], ssl.SSLContext]:
        """The bearer header (if any) and the TLS context for the next request; the context is
        built again only when an exec plugin issued a new client certificate."""
        issued = await self._tokens.issued()
        if self._tls is None or self._tls[0] is not issued:
            self._tls = (issued, ssl_context(self.credentials, issued))
        token = await self._tokens.token()
        return ({"Authorization": f"Bearer {token}"} if token else {}), self._tls[1]

    @contextlib.asynccontextmanager
    async def _exchange(
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
            headers, tls = await self._authorization()
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

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: dict[str, str] | None = None,
        content_type: str = JSON,
    ) -> Body:
        """Any API path, JSON in and out (`path` from the server's root, such as
        /apis/apps/v1/namespaces/x/deployments)."""
        async with self._exchange(method, path, params=params, body=body, content_type=content_type) as response:
            with mapped():
                raw = await response.read()
        answer = decoded(raw)
        if not isinstance(answer, dict):
            raise errors.Unavailable(f"the API answered {method} {path} with something other than a JSON object")
        return answer

    # -- UndoLog objects ----------------------------------------------------------------------

    async def get(self, plural: Plural, namespace: str, name: str) -> Body:
        return trimmed(await self.request("GET", _custom_path(plural, namespace, name)))

    async def list(
        self,
        plural: Plural,
        namespace: str | None = None,
        *,
        field_selector: str | None = None,
        label_selector: str | None = None,
    ) -> builtins.list[Body]:
        """All objects of a kind in a namespace (or all namespaces), following continue tokens.
        A consistent read: it reflects every write acknowledged before it was sent."""
        items, _ = await self.list_versioned(
            plural, namespace, field_selector=field_selector, label_selector=label_selector
        )
        return items

    async def list_versioned(
        self,
        plural: Plural,
        namespace: str | None = None,
        *,
        field_selector: str | None = None,
        label_selector: str | None = None,
    ) -> tuple[builtins.list[Body], str]:
        """`list`, with the resourceVersion the listing is consistent at (that of its first page)."""
        items: list[Body] = []
        version = ""
        async for page, at in self.list_pages(
            plural, namespace, field_selector=field_selector, label_selector=label_selector
        ):
            items.extend(page)
            version = version or at
        return items, version

    async def list_pages(
        self,
        plural: Plural,
        namespace: str | None = None,
        *,
        field_selector: str | None = None,
        label_selector: str | None = None,
    ) -> AsyncIterator[tuple[builtins.list[Body], str]]:
        """A consistent listing page by page (500 objects), each with its resourceVersion (the
        first page's is the listing's): a caller can make each page smaller before the next."""
        token: str | None = None
        while True:
            params = {"limit": "500"}
            if token:
                params["continue"] = token
            if field_selector:
                params["fieldSelector"] = field_selector
            if label_selector:
                params["labelSelector"] = label_selector
            page = await self.request("GET", _custom_path(plural, namespace), params=params)
            meta = page.get("metadata", {})
            yield [trimmed(item) for item in page.get("items") or []], meta.get("resourceVersion", "")
            token = meta.get("continue")
            if not token:
                return

    async def current_version(self, plural: Plural, namespace: str | None = None) -> str:
        """The resourceVersion a consistent read of `plural` is at now: a page of one object, not
        a listing of all (each live dashboard page asked for one, 50 MB at 10,000 sagas)."""
        page = await self.request("GET", _custom_path(plural, namespace), params={"limit": "1"})
        return str(page.get("metadata", {}).get("resourceVersion", ""))

    async def watch(
        self, plural: Plural, namespace: str | None, version: str, *, label_selector: str | None = None
    ) -> AsyncIterator[tuple[str, Body]]:
        """The changes after resourceVersion `version`, in the order they happened, as (type, body);
        BOOKMARK bodies carry only a resourceVersion. Ends when the apiserver closes the stream;
        a version too old to resume from raises errors.Gone."""
        params = {
            "watch": "true",
            "resourceVersion": version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(self.timeouts.watch),
        }
        if label_selector:
            params["labelSelector"] = label_selector
        bound = aiohttp.ClientTimeout(total=self.timeouts.watch_client, sock_connect=self.timeouts.connect)
        path = _custom_path(plural, namespace)
        async with self._exchange("GET", path, params=params, bound=bound, watching=True) as stream:
            with mapped():
                async for line in stream.content:
                    event = decoded(line)
                    if not isinstance(event, dict) or not isinstance(event.get("object"), dict):
                        continue  # a blank keep-alive line
                    if event.get("type") == "ERROR":  # a Status, such as 410 Expired
                        raise status_error(int(event["object"].get("code") or 500), event["object"])
                    yield str(event["type"]), trimmed(event["object"])

    async def create(self, plural: Plural, namespace: str, body: Body) -> Body:
        return trimmed(await self.request("POST", _custom_path(plural, namespace), body))

    async def patch(self, plural: Plural, namespace: str, name: str, patch: Body) -> Body:
        """JSON merge patch of the object; metadata.resourceVersion in the patch makes it conditional."""
        path = _custom_path(plural, namespace, name)
        return trimmed(await self.request("PATCH", path, patch, content_type=MERGE_PATCH))

    async def patch_status(self, plural: Plural, namespace: str, name: str, patch: Body) -> Body:
        """JSON merge patch of the status subresource (conditional like `patch`)."""
        path = _custom_path(plural, namespace, name, "status")
        return trimmed(await self.request("PATCH", path, patch, content_type=MERGE_PATCH))

    async def replace_status(self, plural: Plural, namespace: str, name: str, version: str, status: Body) -> Body:
        """The whole status replaced by `status`, conditional on resourceVersion `version` (a JSON
        patch: unlike a merge patch, it keeps a null inside an object, such as an output's)."""
        path = _custom_path(plural, namespace, name, "status")
        ops = [
            {"op": "replace", "path": "/metadata/resourceVersion", "value": version},
            {"op": "add", "path": "/status", "value": status},
        ]
        return trimmed(await self.request("PATCH", path, ops, content_type=JSON_PATCH))

    async def delete(
        self, plural: Plural, namespace: str, name: str, *, uid: str | None = None, version: str | None = None
    ) -> None:
        """Delete the object; with `uid` and `version`, only that very copy (errors.Conflict when it
        changed since). Its dependents (owner references) are collected in the background."""
        preconditions = {k: v for k, v in (("uid", uid), ("resourceVersion", version)) if v}
        body: Body = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}
        if preconditions:
            body["preconditions"] = preconditions
        await self.request("DELETE", _custom_path(plural, namespace, name), body)

    # -- the API itself ------------------------------------------------------------------------

    async def raw_get(self, path: str) -> str:
        """GET a non-resource path (such as /metrics) with this client's credentials."""
        async with self._exchange("GET", path, accept="text/plain") as response:
            with mapped():
                return (await response.read()).decode(errors="replace")

    async def whoami(self) -> str:
        """The user the API sees (a SelfSubjectReview), for recording who resolved what."""
        review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
        answer = await self.request("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", review)
        return str(answer["status"]["userInfo"]["username"])

    async def may(self, verb: str, plural: Plural, namespace: str | None) -> bool:
        """Whether the API lets this client's user `verb` UndoLog's `plural` in `namespace` (None:
        all), as `kubectl auth can-i` asks it (a SelfSubjectAccessReview)."""
        attributes = {"group": GROUP, "resource": plural, "verb": verb, "namespace": namespace or ""}
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attributes},
        }
        answer = await self.request("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", review)
        return bool(answer.get("status", {}).get("allowed"))

    # -- core objects ------------------------------------------------------------------------

    async def secret(self, namespace: str, name: str) -> tuple[dict[str, str], dict[str, bytes]]:
        """A Secret's labels and its values, base64-decoded (bytes: a Secret may hold any)."""
        secret = await self.request("GET", f"/api/v1/namespaces/{namespace}/secrets/{name}")
        data = {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}
        return dict(secret["metadata"].get("labels") or {}), data

    async def create_namespace(self, name: str, labels: dict[str, str]) -> None:
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}
        await self.request("POST", "/api/v1/namespaces", body)

    async def delete_namespace(self, name: str) -> None:
        await self.request("DELETE", f"/api/v1/namespaces/{name}")

    async def events_about(self, namespace: str, name: str, uid: str | None = None) -> builtins.list[EventRecord]:
        """core/v1 Events about one object, oldest first (names sort by creation for ours)."""
        selector = f"involvedObject.name={name}" + (f",involvedObject.uid={uid}" if uid else "")
        path = f"/api/v1/namespaces/{namespace}/events"
        listed = await self.request("GET", path, params={"fieldSelector": selector})
        records = [
            EventRecord(
                time=_parsed_time(e.get("eventTime") or e.get("lastTimestamp") or e.get("firstTimestamp")),
                type=e.get("type") or "",
                reason=e.get("reason") or "",
                message=e.get("message") or "",
                name=e["metadata"]["name"],
            )
            for e in listed.get("items") or []
        ]
        return sorted(records, key=lambda r: (r.time or datetime.min.replace(tzinfo=UTC), r.name))

    async def emit_event(
        self,
        regarding: Body,
        *,
        reason: str,
        message: str,
        warning: bool = False,
        component: str = "undolog",
        at: datetime | None = None,
        name: str | None = None,
    ) -> None:
        """A core/v1 Event about an object, so `kubectl describe` reads as a timeline."""
        meta = regarding["metadata"]
        seconds, micro = _event_times(at or now())
        naming = {"name": name} if name else {"generateName": f"{meta['name']}."}
        event: Body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {**naming, "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": regarding.get("apiVersion", f"{GROUP}/{VERSION}"),
                "kind": regarding.get("kind"),
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
            },
            "reason": reason,
            "message": message[:MAX_EVENT_MESSAGE],
            "type": "Warning" if warning else "Normal",
            "firstTimestamp": seconds,
            "lastTimestamp": seconds,
            "eventTime": micro,
            "action": reason,
            "reportingComponent": component,
            "reportingInstance": os.environ.get("HOSTNAME", component),
            "source": {"component": component},
            "count": 1,
        }
        await self.request("POST", f"/api/v1/namespaces/{meta['namespace']}/events", event)

    # -- Leases (leader election) ------------------------------------------------------------

    async def get_lease(self, namespace: str, name: str) -> Body:
        return await self.request("GET", _leases(namespace, name))

    async def create_lease(self, namespace: str, body: Body) -> Body:
        return await self.request("POST", _leases(namespace), body)

    async def replace_lease(self, namespace: str, name: str, body: Body) -> Body:
        """Conditional on body's metadata.resourceVersion: a lost race is errors.Conflict."""
        return await self.request("PUT", _leases(namespace, name), body)

    async def list_leases(self, namespace: str, label_selector: str) -> builtins.list[Body]:
        listed = await self.request("GET", _leases(namespace), params={"labelSelector": label_selector})
        return [dict(item) for item in listed.get("items") or []]
