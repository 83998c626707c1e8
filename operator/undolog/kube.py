"""Thin async adapter over kubernetes_asyncio for UndoLog's kinds, Events and Leases.

Everything that talks to the Kubernetes API (operator, SDK, CLI, tests) goes through here,
so retries on conflicts, content types and error messages are decided in one place.
"""

from __future__ import annotations

import base64
import builtins
import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.exceptions import ApiException

from undolog.api.common import GROUP, VERSION

Plural = Literal["sagas", "undoentries", "webhooks"]
Body = dict[str, Any]
MERGE_PATCH = "application/merge-patch+json"
# A client-side bound above the apiserver's own 60 s: a silent connection must not hang a saga.
REQUEST_TIMEOUT = 75
# The apiserver ends a watch after this long; the client gives up a little later (a stream
# that went silent, say across an apiserver restart, must not hang forever).
WATCH_SECONDS = 300

__all__ = ["ApiException", "Body", "Kube", "Plural", "default_namespace", "is_conflict", "is_not_found", "refusal"]


def is_conflict(error: BaseException) -> bool:
    return isinstance(error, ApiException) and error.status == 409


def is_not_found(error: BaseException) -> bool:
    return isinstance(error, ApiException) and error.status == 404


def trimmed(body: Body) -> Body:
    """An object without metadata.managedFields: often half its size, never read by UndoLog
    (kubectl hides them too)."""
    body.get("metadata", {}).pop("managedFields", None)
    return body


def default_namespace(kubeconfig: str | None = None) -> str:
    """The current context's namespace, or the in-cluster one, or "default"."""
    if os.environ.get("KUBERNETES_SERVICE_HOST") and not (kubeconfig or os.environ.get("KUBECONFIG")):
        try:
            with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace") as file:
                return file.read().strip()
        except OSError:
            return "default"
    path = kubeconfig or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or os.path.expanduser("~/.kube/config")
    try:
        _, current = config.list_kube_config_contexts(path)
    except Exception:
        return "default"
    return str((current or {}).get("context", {}).get("namespace") or "default")


def refusal(error: ApiException) -> str:
    """The apiserver's own message from an error response (it names the field)."""
    try:
        return str(json.loads(error.body or "")["message"])
    except (TypeError, ValueError, KeyError):
        return str(error.reason)


@dataclass
class Kube:
    api: client.ApiClient

    @classmethod
    async def connect(cls, kubeconfig: str | None = None, context: str | None = None) -> Kube:
        """From KUBECONFIG (or the given file), else the in-cluster service account."""
        configuration = client.Configuration()
        path = kubeconfig or os.environ.get("KUBECONFIG")
        if path or not os.environ.get("KUBERNETES_SERVICE_HOST"):
            await config.load_kube_config(config_file=path, context=context, client_configuration=configuration)
        else:
            config.load_incluster_config(client_configuration=configuration)
        return cls(client.ApiClient(configuration))

    async def close(self) -> None:
        await self.api.close()

    async def __aenter__(self) -> Kube:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    @property
    def _custom(self) -> Any:
        return client.CustomObjectsApi(self.api)

    # -- UndoLog objects ----------------------------------------------------------------------

    async def get(self, plural: Plural, namespace: str, name: str) -> Body:
        body: Body = await self._custom.get_namespaced_custom_object(
            GROUP, VERSION, namespace, plural, name, _request_timeout=REQUEST_TIMEOUT
        )
        return trimmed(body)

    async def list(
        self,
        plural: Plural,
        namespace: str | None = None,
        *,
        field_selector: str | None = None,
        label_selector: str | None = None,
    ) -> list[Body]:
        """All objects of a kind in a namespace (or all namespaces), following continue tokens."""
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
            kwargs: dict[str, Any] = {"limit": 500, "_request_timeout": REQUEST_TIMEOUT}
            if token:
                kwargs["_continue"] = token
            if field_selector:
                kwargs["field_selector"] = field_selector
            if label_selector:
                kwargs["label_selector"] = label_selector
            if namespace:
                page = await self._custom.list_namespaced_custom_object(GROUP, VERSION, namespace, plural, **kwargs)
            else:
                page = await self._custom.list_cluster_custom_object(GROUP, VERSION, plural, **kwargs)
            items.extend(trimmed(item) for item in page.get("items", []))
            version = version or page.get("metadata", {}).get("resourceVersion", "")
            token = page.get("metadata", {}).get("continue")
            if not token:
                return items, version

    async def watch(self, plural: Plural, namespace: str | None, version: str) -> AsyncIterator[tuple[str, Body]]:
        """The changes after resourceVersion `version`, in the order they happened, as (type, body);
        BOOKMARK bodies carry only a resourceVersion. Ends when the apiserver closes the stream;
        a version too old to resume from raises ApiException 410."""
        kwargs: dict[str, Any] = {
            "resource_version": version,
            "allow_watch_bookmarks": True,
            "timeout_seconds": WATCH_SECONDS,
            "_request_timeout": WATCH_SECONDS + 30,
        }
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
        created: Body = await self._custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, plural, body, _request_timeout=REQUEST_TIMEOUT
        )
        return trimmed(created)

    async def patch(self, plural: Plural, namespace: str, name: str, patch: Body) -> Body:
        """JSON merge patch of the object; metadata.resourceVersion in the patch makes it conditional."""
        patched: Body = await self._custom.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, plural, name, patch, _content_type=MERGE_PATCH, _request_timeout=REQUEST_TIMEOUT
        )
        return trimmed(patched)

    async def patch_status(self, plural: Plural, namespace: str, name: str, patch: Body) -> Body:
        """JSON merge patch of the status subresource (conditional like `patch`)."""
        patched: Body = await self._custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, plural, name, patch, _content_type=MERGE_PATCH, _request_timeout=REQUEST_TIMEOUT
        )
        return trimmed(patched)

    async def delete(self, plural: Plural, namespace: str, name: str) -> None:
        await self._custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, plural, name)

    async def raw_get(self, path: str) -> str:
        """GET a non-resource path (such as /metrics) with this client's credentials."""
        configuration = self.api.configuration
        headers = {"Accept": "text/plain"}
        for setting in (await configuration.auth_settings()).values():
            headers[setting["key"]] = setting["value"]
        response = await self.api.rest_client.request("GET", f"{configuration.host}{path}", headers=headers)
        return str(response.data.decode() if isinstance(response.data, bytes) else response.data)

    async def whoami(self) -> str:
        """The user the API sees (a SelfSubjectReview), for recording who resolved what."""
        review = await client.AuthenticationV1Api(self.api).create_self_subject_review(
            client.V1SelfSubjectReview(api_version="authentication.k8s.io/v1", kind="SelfSubjectReview")
        )
        return str(review.status.user_info.username)

    async def events_about(self, namespace: str, name: str, uid: str | None = None) -> builtins.list[Any]:
        """core/v1 Events about one object, oldest first (names sort by creation for ours)."""
        selector = f"involvedObject.name={name}" + (f",involvedObject.uid={uid}" if uid else "")
        listed = await client.CoreV1Api(self.api).list_namespaced_event(namespace, field_selector=selector)
        return sorted(
            listed.items, key=lambda e: (e.event_time or e.last_timestamp or e.first_timestamp, e.metadata.name)
        )

    # -- core objects ------------------------------------------------------------------------

    async def secret_data(self, namespace: str, name: str) -> dict[str, str]:
        """A Secret's values, decoded."""
        secret = await client.CoreV1Api(self.api).read_namespaced_secret(name, namespace)
        return {k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()}

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
        now = at or datetime.now(UTC)
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
            message=message[:1024],
            type="Warning" if warning else "Normal",
            first_timestamp=now,
            last_timestamp=now,
            event_time=now,
            action=reason,
            reporting_component=component,
            reporting_instance=os.environ.get("HOSTNAME", component),
            source=client.V1EventSource(component=component),
            count=1,
        )
        await client.CoreV1Api(self.api).create_namespaced_event(meta["namespace"], event)
