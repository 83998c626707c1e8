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
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

import aiohttp

from undolog import errors
from undolog.api import GROUP, VERSION
from undolog.api.common import Plural
from undolog.kube.connection import (
    JSON,
    POOL_SIZE,
    TIMEOUTS,
    Connection,
    Timeouts,
    as_kube_error,
    mapped,
    status_error,
)
from undolog.kube.decoding import decoded
from undolog.kube.events import EventRecord, event_body, event_records
from undolog.kube.kubeconfig import Credentials, ExecCredential, credentials

__all__ = ["POOL_SIZE", "TIMEOUTS", "Body", "EventRecord", "Kube", "Timeouts", "as_kube_error"]

Body = dict[str, Any]
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


def trimmed(body: Body) -> Body:
    """An object without metadata.managedFields: often half its size, never read by UndoLog
    (kubectl hides them too)."""
    body.get("metadata", {}).pop("managedFields", None)
    return body


def _custom_path(
    plural: Plural, namespace: str | None, name: str | None = None, subresource: str = "", version: str = VERSION
) -> str:
    path = f"/apis/{GROUP}/{version}" + (f"/namespaces/{namespace}" if namespace else "") + f"/{plural}"
    return path + (f"/{name}" if name else "") + (f"/{subresource}" if subresource else "")


def _leases(namespace: str, name: str | None = None) -> str:
    return f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases" + (f"/{name}" if name else "")


@dataclass
class Kube:
    """The API as one user, JSON bodies in and out (over `Connection`)."""

    credentials: Credentials
    timeouts: Timeouts = TIMEOUTS
    connection: Connection = field(init=False)

    def __post_init__(self) -> None:
        self.connection = Connection(self.credentials, self.timeouts)

    @classmethod
    async def connect(
        cls,
        kubeconfig: str | None = None,
        context: str | None = None,
        *,
        as_user: str | None = None,
        as_groups: Sequence[str] = (),
        request_timeout: float | None = None,
    ) -> Kube:
        """From the given kubeconfig (or KUBECONFIG), else the in-cluster service account;
        `as_user`/`as_groups` impersonate as kubectl's --as/--as-group do (the API checks that
        the real user may impersonate, and then checks the impersonated one's RBAC);
        `request_timeout` bounds each request as kubectl's --request-timeout does. A
        kubeconfig that cannot be used is errors.KubeconfigInvalid here, before any request."""
        timeouts = TIMEOUTS if request_timeout is None else replace(TIMEOUTS, request=request_timeout)
        kube = cls(credentials(kubeconfig, context, as_user=as_user, as_groups=as_groups), timeouts)
        await kube.connection.authorization()
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
        other.connection = self.connection.apart()
        return other

    async def fresh_credentials(self) -> tuple[str | None, ExecCredential | None]:
        """The bearer token and the exec plugin's credential, read or issued again: kopf logs in
        with exactly these, at start and when its own expired or were refused."""
        return await self.connection.fresh_credentials()

    async def close(self) -> None:
        await self.connection.close()

    async def __aenter__(self) -> Kube:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

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
        async with self.connection.exchange(
            method, path, params=params, body=body, content_type=content_type
        ) as response:
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
        async with self.connection.exchange("GET", path, params=params, bound=bound, watching=True) as stream:
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

    async def patch(self, plural: Plural, namespace: str, name: str, patch: Body, *, version: str = VERSION) -> Body:
        """JSON merge patch of the object; metadata.resourceVersion in the patch makes it conditional."""
        path = _custom_path(plural, namespace, name, version=version)
        return trimmed(await self.request("PATCH", path, patch, content_type=MERGE_PATCH))

    async def patch_status(self, plural: Plural, namespace: str, name: str, patch: Body) -> Body:
        """JSON merge patch of the status subresource (conditional like `patch`)."""
        path = _custom_path(plural, namespace, name, "status")
        return trimmed(await self.request("PATCH", path, patch, content_type=MERGE_PATCH))

    async def replace_status(
        self, plural: Plural, namespace: str, name: str, version: str, status: Body, *, with_object_at: str = ""
    ) -> Body:
        """The whole status replaced by `status`, conditional on resourceVersion `version` (a JSON
        patch: unlike a merge patch, it keeps a null inside an object, such as an output's).
        `with_object_at`: written with the object at that API version (served without the status
        subresource), its field owners (metadata.managedFields) dropped by the same write."""
        path = _custom_path(plural, namespace, name, "" if with_object_at else "status", with_object_at or VERSION)
        ops = [
            {"op": "replace", "path": "/metadata/resourceVersion", "value": version},
            {"op": "add", "path": "/status", "value": status},
        ]
        if with_object_at:
            ops.append({"op": "add", "path": "/metadata/managedFields", "value": [{}]})
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
        async with self.connection.exchange("GET", path, accept="text/plain") as response:
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
        return event_records(await self.request("GET", path, params={"fieldSelector": selector}))

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
        event = event_body(
            regarding, reason=reason, message=message, warning=warning, component=component, at=at, name=name
        )
        await self.request("POST", f"/api/v1/namespaces/{regarding['metadata']['namespace']}/events", event)

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
