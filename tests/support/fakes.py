"""Fakes at the operator's seams, for unit tests of the operator layer without sockets:
an in-memory object store behind the ledger (resourceVersions, conditional writes, merge
patches, selectors as the apiserver applies them) and a scripted participant transport."""

from __future__ import annotations

import asyncio
import builtins
import copy
import itertools
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from undolog import errors
from undolog.api.common import VERSION, Plural
from undolog.calls.transport import PreparedCall
from undolog.conventions import timestamp
from undolog.decisions.retry import CallOutcome
from undolog.kube import Body


def merge(target: Body, patch: Body) -> Body:
    """RFC 7386 JSON merge patch: objects merge, null removes, anything else replaces."""
    result = copy.deepcopy(target)
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):  # into a new object too: its nulls are dropped as well
            result[key] = merge(result[key] if isinstance(result.get(key), dict) else {}, value)
        else:
            result[key] = copy.deepcopy(value)
    return result


@dataclass
class FakeKube:
    """What the ledger, the registry and the timeline need of the API, in memory."""

    objects: dict[tuple[str, str, str], Body] = field(default_factory=dict)
    secrets: dict[tuple[str, str], tuple[dict[str, str], dict[str, bytes]]] = field(default_factory=dict)
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (object name, reason, message)
    requests: list[tuple[str, str]] = field(default_factory=list)  # (verb, plural) of every request
    refuse: dict[tuple[str, str], errors.KubeError] = field(default_factory=dict)  # (verb, plural) -> error
    # UndoEntries served at ENTRY_STATUS_VERSION too, their status written with the object, as
    # crds/ declares them (False: CRDs installed before that version).
    entry_status_with_object: bool = True
    _revision: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def _stamp(self, body: Body) -> Body:
        body["metadata"]["resourceVersion"] = str(next(self._revision))
        return body

    def _refused(self, verb: str, plural: str) -> None:
        self.requests.append((verb, plural))
        error = self.refuse.get((verb, plural))
        if error is not None:
            raise error

    def _object(self, plural: str, namespace: str, name: str) -> Body:
        try:
            return self.objects[(plural, namespace, name)]
        except KeyError:
            # The apiserver's Status names the object in its details, as here.
            details = errors.StatusDetails(kind=plural, name=name)
            raise errors.NotFound(f'{plural} "{name}" not found', status=404, details=details) from None

    async def get(self, plural: Plural, namespace: str, name: str) -> Body:
        self._refused("get", plural)
        return copy.deepcopy(self._object(plural, namespace, name))

    async def list(
        self,
        plural: Plural,
        namespace: str | None = None,
        *,
        field_selector: str | None = None,
        label_selector: str | None = None,
    ) -> builtins.list[Body]:
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
        self._refused("list", plural)
        fields = dict(part.split("=", 1) for part in (field_selector or "").split(",") if part)
        labels = dict(part.split("=", 1) for part in (label_selector or "").split(",") if part)
        items = []
        for (kind, ns, _), body in sorted(self.objects.items()):
            if kind != plural or namespace not in (None, ns):
                continue
            if any(str(body.get("spec", {}).get(k.removeprefix("spec."))) != v for k, v in fields.items()):
                continue
            if any((body["metadata"].get("labels") or {}).get(k) != v for k, v in labels.items()):
                continue
            items.append(copy.deepcopy(body))
        return items, str(next(self._revision))

    async def list_pages(
        self,
        plural: Plural,
        namespace: str | None = None,
        *,
        field_selector: str | None = None,
        label_selector: str | None = None,
    ) -> AsyncIterator[tuple[builtins.list[Body], str]]:
        yield await self.list_versioned(plural, namespace, field_selector=field_selector, label_selector=label_selector)

    def watch(
        self, plural: Plural, namespace: str | None, version: str, *, label_selector: str | None = None
    ) -> AsyncIterator[tuple[str, Body]]:
        raise NotImplementedError("the operator-layer tests drive the engine directly, not by a watch")

    async def create(self, plural: Plural, namespace: str, body: Body) -> Body:
        self._refused("create", plural)
        name = body["metadata"].get("name") or f"{body['metadata']['generateName']}{uuid.uuid4().hex[:5]}"
        if (plural, namespace, name) in self.objects:
            raise errors.AlreadyExists(f'{plural} "{name}" already exists', status=409, reason="AlreadyExists")
        stored = copy.deepcopy(body)
        stored.pop("status", None)
        stored["metadata"].update(
            name=name, namespace=namespace, uid=str(uuid.uuid4()), generation=1, creationTimestamp=timestamp()
        )
        self.objects[(plural, namespace, name)] = self._stamp(stored)
        return copy.deepcopy(stored)

    def put(self, plural: Plural, body: Body) -> Body:
        """An object as someone else wrote it (status included), e.g. an agent's entry."""
        stored = copy.deepcopy(body)
        meta = stored["metadata"]
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("generation", 1)
        meta.setdefault("creationTimestamp", timestamp())
        self.objects[(plural, meta["namespace"], meta["name"])] = self._stamp(stored)
        return copy.deepcopy(stored)

    async def patch(self, plural: Plural, namespace: str, name: str, patch: Body, *, version: str = VERSION) -> Body:
        self._refused("patch", plural)
        return self._patched(plural, namespace, name, patch, status=False, at=version)

    async def patch_status(self, plural: Plural, namespace: str, name: str, patch: Body) -> Body:
        self._refused("patch-status", plural)
        return self._patched(plural, namespace, name, patch, status=True)

    async def replace_status(
        self, plural: Plural, namespace: str, name: str, version: str, status: Body, *, with_object_at: str = ""
    ) -> Body:
        self._refused("patch" if with_object_at else "patch-status", plural)
        self._served(plural, with_object_at or VERSION)
        current = self._object(plural, namespace, name)
        if version != current["metadata"]["resourceVersion"]:
            raise errors.Conflict(f'the object "{name}" has been modified', status=409, reason="Conflict")
        # top-level nulls are pruned by the API (no status field is nullable); nulls inside stay
        updated = {**current, "status": {k: v for k, v in copy.deepcopy(status).items() if v is not None}}
        self.objects[(plural, namespace, name)] = self._stamp(updated)
        return copy.deepcopy(updated)

    def _served(self, plural: str, version: str) -> None:
        if version != VERSION and not (plural == "undoentries" and self.entry_status_with_object):
            raise errors.NotFound("the server could not find the requested resource", status=404)

    def _patched(
        self, plural: Plural, namespace: str, name: str, patch: Body, *, status: bool, at: str = VERSION
    ) -> Body:
        self._served(plural, at)
        current = self._object(plural, namespace, name)
        patch = copy.deepcopy(patch)
        expected = patch.get("metadata", {}).pop("resourceVersion", None)
        if expected is not None and expected != current["metadata"]["resourceVersion"]:
            raise errors.Conflict(f'the object "{name}" has been modified', status=409, reason="Conflict")
        patch.get("metadata", {}).pop("managedFields", None)  # never kept here (the client trims them)
        allowed = {"status"} if status else {"metadata", "spec", *(("status",) if at != VERSION else ())}
        updated = merge(current, {k: v for k, v in patch.items() if k in allowed})
        if updated.get("spec") != current.get("spec"):
            updated["metadata"]["generation"] += 1
        self.objects[(plural, namespace, name)] = self._stamp(updated)
        return copy.deepcopy(updated)

    async def delete(
        self, plural: Plural, namespace: str, name: str, *, uid: str | None = None, version: str | None = None
    ) -> None:
        self._refused("delete", plural)
        current = self._object(plural, namespace, name)
        meta = current["metadata"]
        if (uid and uid != meta["uid"]) or (version and version != meta["resourceVersion"]):
            raise errors.Conflict(f'Precondition failed for {plural} "{name}"', status=409, reason="Conflict")
        del self.objects[(plural, namespace, name)]
        owned = [
            key
            for key, body in self.objects.items()
            if any(
                ref.get("uid") == current["metadata"]["uid"] for ref in body["metadata"].get("ownerReferences") or []
            )
        ]
        for key in owned:  # the garbage collector's work
            del self.objects[key]

    async def secret(self, namespace: str, name: str) -> tuple[dict[str, str], dict[str, bytes]]:
        try:
            return self.secrets[(namespace, name)]
        except KeyError:
            raise errors.NotFound(f'secrets "{name}" not found', status=404) from None

    async def emit_event(
        self, regarding: Body, *, reason: str, message: str, warning: bool, at: datetime, name: str
    ) -> None:
        self.events.append((regarding["metadata"]["name"], reason, message))

    def body(self, plural: Plural, namespace: str, name: str) -> Body:
        return copy.deepcopy(self._object(plural, namespace, name))

    async def whoami(self) -> str:
        return "alice"


@dataclass
class FakeTransport:
    """A participant by script: outcomes per path, in order, then `default`; every call kept."""

    scripts: dict[str, list[CallOutcome]] = field(default_factory=dict)
    default: CallOutcome = field(default_factory=lambda: CallOutcome(status_code=200))
    sent: list[PreparedCall] = field(default_factory=list)
    on_send: Callable[[PreparedCall], Any] | None = None  # runs as the call arrives (a racing writer)
    queued: float = 0.0  # seconds each call waits for a participant slot before it leaves

    def script(self, path: str, *outcomes: CallOutcome) -> None:
        self.scripts.setdefault(path, []).extend(outcomes)

    async def send(self, call: PreparedCall) -> CallOutcome:
        await asyncio.sleep(self.queued)
        call.leaving()
        self.sent.append(call)
        if self.on_send is not None:
            result = self.on_send(call)
            if hasattr(result, "__await__"):
                await result
        path = "/" + call.target.url.split("/", 3)[-1] if call.target.url.count("/") >= 3 else "/"
        script = self.scripts.get(path)
        return script.pop(0) if script else self.default

    async def close(self) -> None:
        return None

    def paths(self) -> list[str]:
        return ["/" + c.target.url.split("/", 3)[-1] for c in self.sent]


@dataclass
class FixedFence:
    """A fence that says what the test wants: leading with a token, or not leading."""

    leading: bool = True
    fence: int | None = 7

    def check(self) -> None:
        if not self.leading:
            raise errors.NotLeading("the test took the Lease away")

    def token(self) -> int | None:
        return self.fence

    def shard(self) -> str | None:
        return "0/1"


@dataclass
class ManualClock:
    """A clock of the test's own (conventions.Clock): time passes when the test says."""

    wall: datetime
    ticks: float = 0.0

    def now(self) -> datetime:
        return self.wall

    def monotonic(self) -> float:
        return self.ticks

    def advance(self, seconds: float) -> None:
        self.wall += timedelta(seconds=seconds)
        self.ticks += seconds
