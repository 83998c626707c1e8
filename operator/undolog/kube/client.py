"""The one client of the Kubernetes API: UndoLog's kinds, Events, Secrets, Leases.

Everything that talks to the API (operator, SDK, CLI, tests) goes through here, so content
types, timeouts and errors are decided in one place: the client's exceptions become
`undolog.errors.KubeError`s here and nowhere else.
"""

from __future__ import annotations

import base64
import builtins
import contextlib
import json
import os
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp
from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.exceptions import ApiException
from multidict import CIMultiDict

from undolog import errors
from undolog.api import GROUP, VERSION
from undolog.api.common import Plural
from undolog.conventions import MAX_EVENT_MESSAGE, now

Body = dict[str, Any]
MERGE_PATCH = "application/merge-patch+json"


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


def _message(error: ApiException) -> tuple[str, str]:
    """The apiserver's own message (it names the object and the field) and its reason."""
    try:
        status = json.loads(error.body or "")
        return str(status["message"]), str(status.get("reason", ""))
    except (TypeError, ValueError, KeyError):
        return str(error.reason or f"HTTP {error.status}"), str(error.reason or "")


def as_kube_error(error: BaseException) -> errors.KubeError | None:
    """The KubeError a client exception stands for; None for anything else."""
    if isinstance(error, errors.KubeError):
        return error
    if isinstance(error, ApiException):
        message, reason = _message(error)
        kind = _ERRORS.get(error.status or 0, errors.Unavailable)
        if kind is errors.Conflict and reason == "AlreadyExists":
            kind = errors.AlreadyExists
        return kind(message, status=error.status, reason=reason)
    if isinstance(error, (aiohttp.ClientError, TimeoutError, OSError)):
        return errors.Unavailable(f"the API could not be reached: {error or type(error).__name__}")
    return None


@contextlib.contextmanager
def mapped() -> Iterator[None]:
    """Client exceptions raised inside become KubeErrors."""
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


def _tuned(api: client.ApiClient, headers: CIMultiDict[str]) -> client.ApiClient:
    """The client's HTTP session, with `headers` on every request (several of one name, which
    impersonating several groups needs) and without trust_env (the generated client looks up
    .netrc and proxies in a worker thread on every request otherwise)."""
    rest = api.rest_client
    old = rest.pool_manager
    rest.pool_manager = aiohttp.ClientSession(
        connector=old.connector, connector_owner=True, trust_env=False, read_bufsize=2**21, headers=headers
    )
    old._connector_owner = False  # the connector now belongs to the new session
    old._connector = None
    return api


def kubeconfig_path(kubeconfig: str | None = None) -> str:
    return kubeconfig or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or os.path.expanduser("~/.kube/config")


def in_cluster(kubeconfig: str | None = None) -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and not (kubeconfig or os.environ.get("KUBECONFIG"))


def default_namespace(kubeconfig: str | None = None, context: str | None = None) -> str:
    """The context's namespace, or the in-cluster one, or "default"."""
    if in_cluster(kubeconfig):
        try:
            with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace") as file:
                return file.read().strip()
        except OSError:
            return "default"
    try:
        contexts, current = config.list_kube_config_contexts(kubeconfig_path(kubeconfig))
    except Exception:  # no kubeconfig, or one that cannot be read: the API's default
        return "default"
    chosen = next((c for c in contexts if c.get("name") == context), None) if context else current
    return str((chosen or {}).get("context", {}).get("namespace") or "default")


@dataclass
class Kube:
    api: client.ApiClient
    timeouts: Timeouts = TIMEOUTS

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
        the real user may impersonate, and then checks the impersonated one's RBAC)."""
        configuration = client.Configuration()
        if in_cluster(kubeconfig) and context is None:
            config.load_incluster_config(client_configuration=configuration)
        else:
            await config.load_kube_config(
                config_file=kubeconfig or os.environ.get("KUBECONFIG"),
                context=context,
                client_configuration=configuration,
            )
        headers = CIMultiDict[str]()
        if as_user:
            headers.add("Impersonate-User", as_user)
        for group in as_groups:
            headers.add("Impersonate-Group", group)
        return cls(_tuned(client.ApiClient(configuration), headers))

    @classmethod
    def with_token(cls, server: str, ca_file: str | None, token: str) -> Kube:
        """As whoever `token` belongs to (a person's bearer token, as a dashboard receives it),
        never this process's own service account."""
        configuration = client.Configuration()
        configuration.host = server
        configuration.ssl_ca_cert = ca_file
        configuration.api_key = {"BearerToken": f"Bearer {token}"}
        return cls(_tuned(client.ApiClient(configuration), CIMultiDict()))

    async def close(self) -> None:
        await self.api.close()

    async def __aenter__(self) -> Kube:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    @property
    def _custom(self) -> Any:
        return client.CustomObjectsApi(self.api)

    @property
    def _core(self) -> Any:
        return client.CoreV1Api(self.api)

    # -- UndoLog objects ----------------------------------------------------------------------

    async def get(self, plural: Plural, namespace: str, name: str) -> Body:
        with mapped():
            body: Body = await self._custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, plural, name, _request_timeout=self.timeouts.request
            )
        return trimmed(body)

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
        token: str | None = None
        version = ""
        while True:
            kwargs: dict[str, Any] = {"limit": 500, "_request_timeout": self.timeouts.request}
            if token:
                kwargs["_continue"] = token
            if field_selector:
                kwargs["field_selector"] = field_selector
            if label_selector:
                kwargs["label_selector"] = label_selector
            with mapped():
                if namespace:
                    page = await self._custom.list_namespaced_custom_object(GROUP, VERSION, namespace, plural, **kwargs)
                else:
                    page = await self._custom.list_cluster_custom_object(GROUP, VERSION, plural, **kwargs)
            items.extend(trimmed(item) for item in page.get("items", []))
            version = version or page.get("metadata", {}).get("resourceVersion", "")
            token = page.get("metadata", {}).get("continue")
            if not token:
                return items, version

    async def watch(
        self, plural: Plural, namespace: str | None, version: str, *, label_selector: str | None = None
    ) -> AsyncIterator[tuple[str, Body]]:
        """The changes after resourceVersion `version`, in the order they happened, as (type, body);
        BOOKMARK bodies carry only a resourceVersion. Ends when the apiserver closes the stream;
        a version too old to resume from raises errors.Gone."""
        kwargs: dict[str, Any] = {
            "resource_version": version,
            "allow_watch_bookmarks": True,
            "timeout_seconds": self.timeouts.watch,
            "_request_timeout": self.timeouts.watch_client,
        }
        if label_selector:
            kwargs["label_selector"] = label_selector
        with mapped():
            async with watch.Watch() as stream:
                if namespace:
                    events = stream.stream(
                        self._custom.list_namespaced_custom_object, GROUP, VERSION, namespace, plural, **kwargs
                    )
                else:
                    events = stream.stream(self._custom.list_cluster_custom_object, GROUP, VERSION, plural, **kwargs)
                async for event in events:
                    yield event["type"], trimmed(event["raw_object"])

    async def create(self, plural: Plural, namespace: str, body: Body) -> Body:
        with mapped():
            created: Body = await self._custom.create_namespaced_custom_object(
                GROUP, VERSION, namespace, plural, body, _request_timeout=self.timeouts.request
            )
        return trimmed(created)

    async def patch(self, plural: Plural, namespace: str, name: str, patch: Body) -> Body:
        """JSON merge patch of the object; metadata.resourceVersion in the patch makes it conditional."""
        return await self._merge(self._custom.patch_namespaced_custom_object, plural, namespace, name, patch)

    async def patch_status(self, plural: Plural, namespace: str, name: str, patch: Body) -> Body:
        """JSON merge patch of the status subresource (conditional like `patch`)."""
        return await self._merge(self._custom.patch_namespaced_custom_object_status, plural, namespace, name, patch)

    async def _merge(self, method: Any, plural: Plural, namespace: str, name: str, patch: Body) -> Body:
        with mapped():
            patched: Body = await method(
                GROUP,
                VERSION,
                namespace,
                plural,
                name,
                patch,
                _content_type=MERGE_PATCH,
                _request_timeout=self.timeouts.request,
            )
        return trimmed(patched)

    async def delete(self, plural: Plural, namespace: str, name: str) -> None:
        with mapped():
            await self._custom.delete_namespaced_custom_object(
                GROUP, VERSION, namespace, plural, name, _request_timeout=self.timeouts.request
            )

    # -- the API itself ------------------------------------------------------------------------

    async def raw_get(self, path: str) -> str:
        """GET a non-resource path (such as /metrics) with this client's credentials."""
        configuration = self.api.configuration
        headers = {"Accept": "text/plain"}
        for setting in (await configuration.auth_settings()).values():
            headers[setting["key"]] = setting["value"]
        with mapped():
            response = await self.api.rest_client.request("GET", f"{configuration.host}{path}", headers=headers)
        return str(response.data.decode() if isinstance(response.data, bytes) else response.data)

    async def whoami(self) -> str:
        """The user the API sees (a SelfSubjectReview), for recording who resolved what."""
        with mapped():
            review = await client.AuthenticationV1Api(self.api).create_self_subject_review(
                client.V1SelfSubjectReview(api_version="authentication.k8s.io/v1", kind="SelfSubjectReview")
            )
        return str(review.status.user_info.username)

    # -- core objects ------------------------------------------------------------------------

    async def secret(self, namespace: str, name: str) -> tuple[dict[str, str], dict[str, str]]:
        """A Secret's labels and its values, decoded."""
        with mapped():
            secret = await self._core.read_namespaced_secret(name, namespace, _request_timeout=self.timeouts.request)
        data = {k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()}
        return dict(secret.metadata.labels or {}), data

    async def create_namespace(self, name: str, labels: dict[str, str]) -> None:
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}
        with mapped():
            await self._core.create_namespace(body, _request_timeout=self.timeouts.request)

    async def delete_namespace(self, name: str) -> None:
        with mapped():
            await self._core.delete_namespace(name, _request_timeout=self.timeouts.request)

    async def events_about(self, namespace: str, name: str, uid: str | None = None) -> builtins.list[EventRecord]:
        """core/v1 Events about one object, oldest first (names sort by creation for ours)."""
        selector = f"involvedObject.name={name}" + (f",involvedObject.uid={uid}" if uid else "")
        with mapped():
            listed = await self._core.list_namespaced_event(
                namespace, field_selector=selector, _request_timeout=self.timeouts.request
            )
        records = [
            EventRecord(
                time=e.event_time or e.last_timestamp or e.first_timestamp,
                type=e.type or "",
                reason=e.reason or "",
                message=e.message or "",
                name=e.metadata.name,
            )
            for e in listed.items
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
        when = at or now()
        event = client.CoreV1Event(
            metadata=client.V1ObjectMeta(
                name=name, generate_name=None if name else f"{meta['name']}.", namespace=meta["namespace"]
            ),
            involved_object=client.V1ObjectReference(
                api_version=regarding.get("apiVersion", f"{GROUP}/{VERSION}"),
                kind=regarding.get("kind"),
                name=meta["name"],
                namespace=meta["namespace"],
                uid=meta.get("uid"),
                resource_version=meta.get("resourceVersion"),
            ),
            reason=reason,
            message=message[:MAX_EVENT_MESSAGE],
            type="Warning" if warning else "Normal",
            first_timestamp=when,
            last_timestamp=when,
            event_time=when,
            action=reason,
            reporting_component=component,
            reporting_instance=os.environ.get("HOSTNAME", component),
            source=client.V1EventSource(component=component),
            count=1,
        )
        with mapped():
            await self._core.create_namespaced_event(meta["namespace"], event, _request_timeout=self.timeouts.request)

    # -- Leases (leader election) ------------------------------------------------------------

    async def get_lease(self, namespace: str, name: str) -> Body:
        with mapped():
            lease = await client.CoordinationV1Api(self.api).read_namespaced_lease(
                name, namespace, _request_timeout=self.timeouts.request
            )
        return dict(self.api.sanitize_for_serialization(lease))

    async def create_lease(self, namespace: str, body: Body) -> Body:
        with mapped():
            lease = await client.CoordinationV1Api(self.api).create_namespaced_lease(
                namespace, body, _request_timeout=self.timeouts.request
            )
        return dict(self.api.sanitize_for_serialization(lease))

    async def replace_lease(self, namespace: str, name: str, body: Body) -> Body:
        """Conditional on body's metadata.resourceVersion: a lost race is errors.Conflict."""
        with mapped():
            lease = await client.CoordinationV1Api(self.api).replace_namespaced_lease(
                name, namespace, body, _request_timeout=self.timeouts.request
            )
        return dict(self.api.sanitize_for_serialization(lease))

    async def list_leases(self, namespace: str, label_selector: str) -> builtins.list[Body]:
        with mapped():
            leases = await client.CoordinationV1Api(self.api).list_namespaced_lease(
                namespace, label_selector=label_selector, _request_timeout=self.timeouts.request
            )
        return [dict(self.api.sanitize_for_serialization(lease)) for lease in leases.items]
