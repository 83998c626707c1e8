"""Any Kubernetes object, as one user reaches it: what a step changed, read before and after it,
and undone by the operator (decisions/object_undo.py decides what to write). Each user's
client impersonates them (`Impersonate-User`, `Impersonate-Group`): the API checks that this
process may impersonate them, and then their own RBAC, so an undo never has more rights than
the user it acts as."""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from undolog import errors
from undolog.api import ActAs, ObjectReference
from undolog.api.undo_entry import MAX_OBJECT_BYTES
from undolog.kube.client import JSON_PATCH, Body, Kube, trimmed

DISCOVERY_SECONDS = 300.0
MAX_USERS = 64  # impersonating clients kept (each a pool of connections): the least recently used closed


def object_path(ref: ObjectReference) -> str:
    group, _, version = ref.api_version.rpartition("/")
    root = f"/apis/{group}/{version}" if group else f"/api/{version}"
    return root + (f"/namespaces/{ref.namespace}" if ref.namespace else "") + f"/{ref.resource}"


@dataclass(frozen=True)
class Objects:
    """The API's objects as one user."""

    kube: Kube

    async def get(self, ref: ObjectReference) -> Body | None:
        """The object (without its managedFields), or None when there is none of that name."""
        try:
            return trimmed(await self.kube.request("GET", f"{object_path(ref)}/{ref.name}"))
        except errors.NotFound:
            return None

    async def create(self, ref: ObjectReference, manifest: Body) -> Body:
        return trimmed(await self.kube.request("POST", object_path(ref), manifest))

    async def delete(self, ref: ObjectReference, uid: str, version: str) -> None:
        """Only that very copy (errors.Conflict when it changed or was replaced since)."""
        body = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "propagationPolicy": "Background",
            "preconditions": {"uid": uid, "resourceVersion": version},
        }
        await self.kube.request("DELETE", f"{object_path(ref)}/{ref.name}", body)

    async def patch(self, ref: ObjectReference, operations: list[dict[str, Any]]) -> Body:
        """A JSON patch: its `test` of the resourceVersion makes it apply to the copy read only."""
        path = f"{object_path(ref)}/{ref.name}"
        return trimmed(await self.kube.request("PATCH", path, operations, content_type=JSON_PATCH))


class Discovery:
    """What the API serves (its preferred versions), read once per DISCOVERY_SECONDS for each API
    server: a tool names an object as kubectl does, and each call would otherwise cost a read of
    every API group."""

    # Shared by every reader of the same API server in the process: the SDK makes one per step.
    _read: ClassVar[dict[str, tuple[float, list[tuple[str, dict[str, Any]]]]]] = {}

    def __init__(self, kube: Kube, clock: Callable[[], float] = time.monotonic) -> None:
        self.kube, self.clock = kube, clock

    async def resolve(self, resource: str, namespace: str | None, name: str) -> ObjectReference:
        """The object named as kubectl names it (`deployment`, `deployments.apps`, `cm`, a kind);
        errors.NotFound naming what was looked for. A name the kept discovery lacks is looked for
        again in a fresh one (a CRD installed since)."""
        for fresh in (False, True):
            found = self._named(await self.served(fresh=fresh), resource, namespace, name)
            if found is not None:
                return found
        raise errors.NotFound(f"the API serves no resource {resource!r} (as kubectl names them: deployment, cm, ...)")

    @staticmethod
    def _named(
        served: list[tuple[str, dict[str, Any]]], resource: str, namespace: str | None, name: str
    ) -> ObjectReference | None:
        wanted, _, group = resource.lower().partition(".")
        for group_version, entry in served:
            names = {entry["name"], str(entry.get("singularName") or ""), str(entry["kind"]).lower()}
            names |= set(entry.get("shortNames") or ())
            if wanted in names and (not group or group_version.startswith(group + "/")):
                scope = (namespace or "default") if entry.get("namespaced") else None
                return ObjectReference(
                    api_version=group_version, kind=entry["kind"], resource=entry["name"], namespace=scope, name=name
                )
        return None

    async def served(self, *, fresh: bool = False) -> list[tuple[str, dict[str, Any]]]:
        """Every (groupVersion, resource) at the API's preferred versions, subresources left out;
        read again when `fresh` or older than DISCOVERY_SECONDS."""
        read_at, served = self._read.get(self.kube.server, (float("-inf"), []))
        if not fresh and self.clock() - read_at < DISCOVERY_SECONDS:
            return served
        groups = await self.kube.request("GET", "/apis")
        versions = ["v1", *(str(g["preferredVersion"]["groupVersion"]) for g in groups.get("groups") or ())]
        served = []
        for version in versions:
            listed = await self.kube.request("GET", f"/apis/{version}" if "/" in version else f"/api/{version}")
            resources = (r for r in listed.get("resources") or () if isinstance(r, dict))
            served.extend((version, r) for r in resources if "/" not in str(r.get("name")))
        self._read[self.kube.server] = (self.clock(), served)
        return served


class Impersonation:
    """One client per user acted as, over this process's own credentials."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self._clients: OrderedDict[tuple[str, tuple[str, ...]], Kube] = OrderedDict()

    async def acting_as(self, who: ActAs) -> Objects:
        key = (who.user, tuple(who.groups))
        client = self._clients.pop(key, None)
        if client is None:
            as_them = replace(self.kube.credentials, as_user=who.user, as_groups=tuple(who.groups))
            client = Kube(as_them, self.kube.timeouts)
        self._clients[key] = client
        while len(self._clients) > MAX_USERS:
            _, oldest = self._clients.popitem(last=False)
            await oldest.close()
        return Objects(client)

    async def close(self) -> None:
        for client in self._clients.values():
            await client.close()
        self._clients.clear()


class ObjectReads:
    """The object a step changes, named as kubectl names it and read as whom its undo acts as:
    what the gateway, the operator's orchestrated steps and (as the agent itself) the SDK share."""

    def __init__(self, kube: Kube) -> None:
        self.discovery = Discovery(kube)
        self.impersonation = Impersonation(kube)

    async def before(
        self, resource: str, namespace: str | None, name: str, act_as: ActAs
    ) -> tuple[Objects, ObjectReference, Body | None]:
        """Its reference, how to read it again, and the object now (None: absent); errors.NotFound
        or errors.Forbidden naming what could not be read, errors.Invalid when it is more than
        UndoLog keeps of an object."""
        ref = await self.discovery.resolve(resource, namespace, name)
        objects = await self.impersonation.acting_as(act_as)
        before = await objects.get(ref)
        if before is not None and len(json.dumps(before, separators=(",", ":"))) > MAX_OBJECT_BYTES:
            raise errors.Invalid(f"{ref} is more than the {MAX_OBJECT_BYTES} bytes UndoLog keeps of an object")
        return objects, ref, before
