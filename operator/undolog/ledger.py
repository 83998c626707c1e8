"""The ledger: Sagas and UndoEntries in etcd, read as typed objects and written conditionally.

Objects are parsed once, here, into the API models (which keep their resourceVersion). Every
write carries the resourceVersion it was decided from, so a stale writer (an older operator, a
decision made on an old copy) gets errors.Conflict and decides again; an entry's status write
that lost the race to a writer of *other* fields (an agent recording its effect) is replayed on
the fresh copy instead of deciding (and calling) again.
"""

from __future__ import annotations

import asyncio
import builtins
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol, TypeVar

from pydantic import BaseModel, ValidationError

from undolog import errors
from undolog.api import (
    API_VERSION,
    ENTRY_STATUS_VERSION,
    VERSION,
    Effect,
    EntryReason,
    LostEntry,
    Outcome,
    Resource,
    Rewind,
    Saga,
    SagaSpec,
    SagaStatus,
    UndoEntry,
    UndoEntryStatus,
    Webhook,
    WebhookStatus,
)
from undolog.api.changes import changed
from undolog.api.common import revision_in
from undolog.conventions import FINALIZER, bucket_labels, creation_body, generated_name, owned_by, timestamp
from undolog.decisions import entry_changes
from undolog.kube import Body, Plural

R = TypeVar("R", bound=Resource)
T = TypeVar("T")
NAME_TRIES = 5  # generated saga names tried before giving up
REBASES = 5  # replays of one entry write over other writers' changes before giving up
RETRY_OBJECT_SECONDS = 60.0  # an EntryStatusRoute through /status tries the object again after this
UNSTORED_WHEN_EMPTY = frozenset({"effects", "lostEntries", "lostEntriesOmitted", "unownedEntries"})


class ObjectStore(Protocol):
    """What the ledger needs of the Kubernetes adapter (undolog.kube.Kube; a fake in unit tests)."""

    async def get(self, plural: Plural, namespace: str, name: str) -> Body: ...
    async def list(
        self,
        plural: Plural,
        namespace: str | None = None,
        *,
        field_selector: str | None = None,
        label_selector: str | None = None,
    ) -> builtins.list[Body]: ...
    async def create(self, plural: Plural, namespace: str, body: Body) -> Body: ...
    async def patch(
        self, plural: Plural, namespace: str, name: str, patch: Body, *, version: str = VERSION
    ) -> Body: ...
    async def patch_status(self, plural: Plural, namespace: str, name: str, patch: Body) -> Body: ...
    async def replace_status(
        self, plural: Plural, namespace: str, name: str, version: str, status: Body, *, with_object_at: str = ""
    ) -> Body: ...
    async def secret(self, namespace: str, name: str) -> tuple[dict[str, str], dict[str, bytes]]: ...
    async def delete(
        self, plural: Plural, namespace: str, name: str, *, uid: str | None = None, version: str | None = None
    ) -> None: ...
    def watch(
        self, plural: Plural, namespace: str | None, version: str, *, label_selector: str | None = None
    ) -> AsyncIterator[tuple[str, Body]]: ...
    async def list_versioned(
        self,
        plural: Plural,
        namespace: str | None = None,
        *,
        field_selector: str | None = None,
        label_selector: str | None = None,
    ) -> tuple[builtins.list[Body], str]: ...


@dataclass(frozen=True)
class Unreadable:
    """An UndoEntry the API accepted and UndoLog cannot use: reported on its saga, never skipped."""

    namespace: str
    saga: str
    lost: LostEntry


@dataclass(frozen=True)
class UnreadableSaga:
    """A Saga the API accepted and UndoLog cannot use: the operator leaves it alone and says so
    in a Warning Event (SagaUnreadable); the CLI and the dashboard list it with why."""

    namespace: str
    name: str
    why: str


def first_error(error: ValidationError) -> str:
    """The field and the message of a model's first refusal, for a person."""
    first = error.errors()[0]
    return f"{'.'.join(map(str, first['loc']))}: {first['msg']}"


def parse_saga(body: Body) -> Saga | UnreadableSaga:
    try:
        return Saga.model_validate(body)
    except ValidationError as error:
        meta = body["metadata"]
        return UnreadableSaga(meta["namespace"], meta["name"], first_error(error)[:1024])


def parse_entry(body: Body) -> UndoEntry | Unreadable:
    try:
        return UndoEntry.model_validate(body)
    except ValidationError as error:
        spec = body.get("spec") or {}
        compensation = spec["compensation"] if isinstance(spec.get("compensation"), dict) else {}
        position = spec.get("stackPosition")
        return Unreadable(
            namespace=body["metadata"]["namespace"],
            saga=str(spec.get("saga", "")),
            lost=LostEntry(
                name=body["metadata"]["name"],
                stack_position=position if isinstance(position, int) and position >= 0 else None,
                step=str(spec["step"])[:63] if spec.get("step") else None,
                function=str(compensation.get("function"))[:253] if compensation.get("function") else None,
                why=f"unreadable: {first_error(error)}"[:1024],
            ),
        )


async def through_outage(act: Callable[[], Awaitable[T]], deadline: float, pause: Callable[[int], float]) -> T:
    """`act()`, asked again while the API cannot be reached (an apiserver restart, an upgrade of
    the control plane), `pause(failures so far)` seconds apart, until the monotonic `deadline`;
    then the last Unavailable, for the caller to say what it was doing."""
    failures = 0
    while True:
        try:
            return await act()
        except errors.Unavailable:
            failures += 1
            delay = pause(failures)
            if time.monotonic() + delay > deadline:
                raise
            await asyncio.sleep(delay)


class WaitTimedOut(TimeoutError):
    """`until` ran out of time; `saga` is the copy read last."""

    def __init__(self, saga: Saga) -> None:
        super().__init__(f"saga {saga.reference} is {saga.status.phase}")
        self.saga = saga


async def until(
    read: Callable[[], Awaitable[Saga]], settled: Callable[[Saga], T | None], *, within: float, poll: float
) -> T:
    """Read the saga every `poll` seconds until `settled` answers (or raises); an API that cannot
    be reached (a restart) is waited out, as kubectl wait does. The SDK's and the CLI's waits."""
    deadline = time.monotonic() + within
    while True:
        saga = await through_outage(read, deadline, lambda _: poll)
        found = settled(saga)
        if found is not None:
            return found
        if time.monotonic() > deadline:
            raise WaitTimedOut(saga)
        await asyncio.sleep(poll)


@dataclass(frozen=True)
class EntryListing:
    """A saga's entries as one consistent LIST showed them."""

    entries: list[UndoEntry]
    unreadable: list[Unreadable]
    unowned: list[UndoEntry]  # naming the saga, not owned by it (another's, or nobody's)


class EntryWrites:
    """The ledger's UndoEntry writes in the order they were sent. etcd numbers its commits in
    the order they happen, so a write sent after a moment gets a revision above every write
    acknowledged before that moment: once a watch of the entries has applied that revision, it
    has shown every entry a consistent LIST sent at that moment would. A LIST has to wait until
    the apiserver's cache has caught up with etcd, which takes up to 100 ms when LISTs come
    together; the watch only waits for the write's own echo."""

    def __init__(self) -> None:
        self.sent = 0
        self._waiting: list[tuple[int, str, asyncio.Future[int]]] = []

    def mark(self) -> int:
        """The writes sent from now on come after this mark."""
        return self.sent

    async def next_after(self, mark: int, namespace: str) -> int:
        """The revision of the first acknowledged write of an entry of `namespace` sent after
        `mark` (waits until there is one)."""
        waiter: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        waiting = (mark, namespace, waiter)
        self._waiting.append(waiting)
        try:
            return await waiter
        finally:
            if waiting in self._waiting:
                self._waiting.remove(waiting)

    async def written(self, namespace: str, writing: Awaitable[Body]) -> Body:
        """`writing` (a write of an entry of `namespace`, not sent yet), counted."""
        sent = self.sent = self.sent + 1
        body = await writing
        revision = revision_in(body)
        if revision is not None:
            for mark, of, waiter in self._waiting:
                if mark < sent and of == namespace and not waiter.done():
                    waiter.set_result(revision)
        return body


def conditional(resource: Resource, patch: Body) -> Body:
    """`patch` made conditional on the object's resourceVersion."""
    metadata = {**patch.get("metadata", {}), "resourceVersion": resource.metadata.resource_version}
    return {**patch, "metadata": metadata}


def changed_fields(before: BaseModel, after: BaseModel) -> Body:
    """The top-level fields (by wire name) whose values differ; None for a field removed."""
    old = before.model_dump(mode="json", by_alias=True)
    new = after.model_dump(mode="json", by_alias=True)
    return {key: new.get(key) for key in old.keys() | new.keys() if old.get(key) != new.get(key)}


@dataclass
class EntryStatusRoute:
    """Where an UndoEntry's status is written: with the object, at ENTRY_STATUS_VERSION (served
    without the status subresource), in one write that also drops its field owners
    (metadata.managedFields, which the API then stops recording), so an outcome costs one write
    and a finished entry no cleanup. Where that version is not served yet (this release's code
    before its CRDs: the SDK upgraded first), the object's write answers 404 and the status goes
    through VERSION's /status, as before (the operator then drops the owners when the saga
    finishes), trying the object again every RETRY_OBJECT_SECONDS. One route per process: the
    SDK opens a ledger per use."""

    through_subresource_since: float | None = None  # monotonic

    @property
    def subresource(self) -> bool:
        return self.through_subresource_since is not None

    async def write(self, kube: ObjectStore, base: UndoEntry, ours: Body) -> Body:
        """`ours` (changed status fields) written on `base`, conditional on its resourceVersion."""
        since = self.through_subresource_since
        if since is None or time.monotonic() - since > RETRY_OBJECT_SECONDS:
            try:
                written = await self._written(kube, base, ours, subresource=False)
                self.through_subresource_since = None
                return written
            except errors.NotFound:
                pass  # not served yet, or the entry is gone: /status says which
        written = await self._written(kube, base, ours, subresource=True)
        self.through_subresource_since = time.monotonic()
        return written

    @staticmethod
    def _written(kube: ObjectStore, base: UndoEntry, ours: Body, *, subresource: bool) -> Awaitable[Body]:
        """A merge patch of the fields that changed; with an output, the whole status instead: a
        merge patch takes a null inside an object as "delete the key", so an answer's
        `"parent": null` was stored without `parent`, and a later step's reference to it failed."""
        if ours.get("output") is not None:
            current = base.status.model_dump(mode="json", by_alias=True)
            status = {key: value for key, value in {**current, **ours}.items() if value is not None}
            at = "" if subresource else ENTRY_STATUS_VERSION
            version = base.metadata.resource_version
            return kube.replace_status("undoentries", *base.key, version, status, with_object_at=at)
        if subresource:
            return kube.patch_status("undoentries", *base.key, conditional(base, {"status": ours}))
        patch = conditional(base, {"metadata": {"managedFields": [{}]}, "status": ours})
        return kube.patch("undoentries", *base.key, patch, version=ENTRY_STATUS_VERSION)


ENTRY_STATUS_ROUTE = EntryStatusRoute()


@dataclass
class Ledger:
    kube: ObjectStore
    entry_writes: EntryWrites = field(default_factory=EntryWrites)
    entry_route: EntryStatusRoute = field(default_factory=lambda: ENTRY_STATUS_ROUTE)

    # -- reads -------------------------------------------------------------------------------

    async def saga(self, namespace: str, name: str) -> Saga:
        return Saga.model_validate(await self.kube.get("sagas", namespace, name))

    async def saga_as_listed(self, namespace: str, name: str) -> Saga | UnreadableSaga:
        """The saga, or why UndoLog cannot read it (for people: the CLI, the dashboard)."""
        return parse_saga(await self.kube.get("sagas", namespace, name))

    async def sagas(
        self, namespace: str | None = None, *, label_selector: str | None = None, field_selector: str | None = None
    ) -> tuple[list[Saga | UnreadableSaga], str]:
        """The sagas, and the resourceVersion the listing is consistent at (a watch from it
        misses nothing that changed after)."""
        listed, version = await self.kube.list_versioned(
            "sagas", namespace, label_selector=label_selector, field_selector=field_selector
        )
        return [parse_saga(body) for body in listed], version

    async def entry(self, namespace: str, name: str) -> UndoEntry:
        return UndoEntry.model_validate(await self.kube.get("undoentries", namespace, name))

    async def entries(self, namespace: str | None) -> list[UndoEntry]:
        """Every readable entry of a namespace (or of all)."""
        listed = [parse_entry(body) for body in await self.kube.list("undoentries", namespace)]
        return [e for e in listed if isinstance(e, UndoEntry)]

    async def entries_of(self, saga: Saga) -> EntryListing:
        """Every entry of this saga (not of an earlier one of the same name), by a consistent LIST:
        it reflects every entry whose creation was acknowledged before the LIST was sent."""
        listed = await self.kube.list(
            "undoentries", saga.metadata.namespace, field_selector=f"spec.saga={saga.metadata.name}"
        )
        entries, unreadable, unowned = [], [], []
        for body in listed:
            parsed = parse_entry(body)
            if isinstance(parsed, Unreadable):
                unreadable.append(parsed)
            elif owned_by(parsed, saga.metadata.uid):
                entries.append(parsed)
            else:
                unowned.append(parsed)
        return EntryListing(entries, unreadable, unowned)

    async def webhook(self, namespace: str, name: str) -> Webhook:
        return Webhook.model_validate(await self.kube.get("webhooks", namespace, name))

    # -- writes ------------------------------------------------------------------------------

    async def create_entry(self, entry: UndoEntry) -> UndoEntry:
        """errors.AlreadyExists when the position is taken: one entry per (saga, position)."""
        namespace = entry.metadata.namespace
        created = await self.entry_writes.written(
            namespace, self.kube.create("undoentries", namespace, creation_body(entry))
        )
        return UndoEntry.model_validate(created)

    async def create_saga(
        self,
        namespace: str,
        name: str | None,
        generate_name: str | None,
        spec: SagaSpec,
        annotations: dict[str, str] | None = None,
    ) -> Saga:
        """Created with the operator's finalizer (deleting it at any moment compensates it first)
        and its bucket label, so that the replica driving its shard sees it at once. A generated
        name is chosen here (the bucket comes from the name), again if it is taken."""
        for _ in range(NAME_TRIES if generate_name is not None else 1):
            chosen = generated_name(generate_name) if generate_name is not None else str(name)
            body = {
                "apiVersion": API_VERSION,
                "kind": "Saga",
                "metadata": {
                    "name": chosen,
                    "finalizers": [FINALIZER],
                    "labels": bucket_labels(namespace, chosen),
                    **({"annotations": annotations} if annotations else {}),
                },
                "spec": spec.to_api(),
            }
            try:
                return Saga.model_validate(await self.kube.create("sagas", namespace, body))
            except errors.AlreadyExists:
                if generate_name is None:
                    raise
        raise errors.AlreadyExists(f"no free saga name from generate_name {generate_name!r} after {NAME_TRIES} tries")

    async def stage_effect(self, namespace: str, name: str, effect: Effect) -> Saga:
        """Append a post-commit effect to spec.effects, conditionally: the operator writes the
        same saga, so a conflict reads it again and appends to the fresh list."""
        for _ in range(REBASES):
            saga = await self.saga(namespace, name)
            effects = [e.to_api() for e in saga.spec.effects or []]
            try:
                written = await self.kube.patch(
                    "sagas", namespace, name, conditional(saga, {"spec": {"effects": [*effects, effect.to_api()]}})
                )
                return Saga.model_validate(written)
            except errors.Conflict:
                continue
        raise errors.Conflict(f"Saga {namespace}/{name} kept changing: effect {effect.name!r} was not staged")

    async def write_webhook_status(self, namespace: str, name: str, status: WebhookStatus) -> None:
        """Unconditional: whichever replica saw the participant change last says so."""
        await self.kube.patch_status(
            "webhooks", namespace, name, {"status": status.model_dump(mode="json", by_alias=True)}
        )

    async def write_saga_status(self, saga: Saga, status: SagaStatus) -> Saga:
        # The whole status with explicit nulls: a merge patch then clears what the new one drops
        # (and the empty lists, which the models read back as empty: bytes in etcd for nothing).
        fields = status.model_dump(mode="json", by_alias=True)
        patch = {"status": {k: None if k in UNSTORED_WHEN_EMPTY and not v else v for k, v in fields.items()}}
        written = await self.kube.patch_status("sagas", *saga.key, conditional(saga, patch))
        return Saga.model_validate(written)

    async def stamp_expiry(self, namespace: str, name: str, version: str, at: datetime | None) -> Saga:
        """A finished saga's deletion time (status.expiresAt) stamped again, on that very copy:
        its TTL or the operator's default for its phase gives another now."""
        patch = {"metadata": {"resourceVersion": version}, "status": {"expiresAt": timestamp(at) if at else None}}
        return Saga.model_validate(await self.kube.patch_status("sagas", namespace, name, patch))

    async def write_saga_metadata(
        self,
        saga: Saga,
        *,
        labels: dict[str, str | None] | None = None,
        finalizers: list[str] | None = None,
        forget_owners: bool = False,
    ) -> Saga:
        """`forget_owners`: drop metadata.managedFields (for good: the API records field owners for
        updates again only once an apply writes the object)."""
        metadata: Body = {}
        if labels:
            metadata["labels"] = labels
        if finalizers is not None:
            metadata["finalizers"] = finalizers
        if forget_owners:
            metadata["managedFields"] = [{}]
        written = await self.kube.patch("sagas", *saga.key, conditional(saga, {"metadata": metadata}))
        return Saga.model_validate(written)

    async def file_in_bucket(self, plural: Plural, namespace: str, name: str, saga: str) -> None:
        """Label a saga (or an entry of `saga`) with its bucket: unconditional, the same value
        whoever writes it."""
        await self.kube.patch(plural, namespace, name, {"metadata": {"labels": bucket_labels(namespace, saga)}})

    async def write_entry_status(self, entry: UndoEntry, status: UndoEntryStatus) -> UndoEntry:
        """Write what changed between entry.status and `status`, conditionally. When someone else
        wrote the entry meanwhile without touching those fields (an agent recording its effect's
        outcome while the operator compensates it), the change is replayed on the fresh copy."""
        ours = changed_fields(entry.status, status)
        if not ours:
            return entry
        base = entry
        for _ in range(REBASES):
            try:
                written = await self.entry_writes.written(
                    base.metadata.namespace, self.entry_route.write(self.kube, base, ours)
                )
                return UndoEntry.model_validate(written)
            except errors.Conflict:
                fresh = await self.entry(*base.key)
                theirs = changed_fields(entry.status, fresh.status)
                if fresh.spec == entry.spec and all(theirs.get(key) == value for key, value in ours.items()):
                    return fresh  # this very change is there: a try whose answer was lost landed
                both = sorted(theirs.keys() & ours.keys())
                if fresh.spec != entry.spec or both:
                    what = "its spec" if fresh.spec != entry.spec else f"status {', '.join(both)}"
                    raise errors.Conflict(
                        f"UndoEntry {entry.reference}: {what} changed by another writer since resourceVersion "
                        f"{entry.metadata.resource_version} (now {fresh.metadata.resource_version}, "
                        f"{', '.join(f'{k}={theirs[k]}' for k in both)}): not overwritten",
                        status=409,
                        reason="Conflict",
                    ) from None
                base = fresh
        raise errors.Conflict(f"UndoEntry {entry.reference} kept changing: its status was not written")

    async def mark_not_owned(self, entry: UndoEntry, why: str) -> UndoEntry:
        """The entry names a saga that does not own it: said on the entry, which stays as it is."""
        status = changed(entry.status, entry_changes.not_acted_on(EntryReason.NOT_OWNED_BY_SAGA, why))
        return await self.write_entry_status(entry, status)

    async def forget_entry_owners(self, entry: UndoEntry) -> UndoEntry:
        """Drop the entry's metadata.managedFields, once it is final (its saga finished): needed
        only while entries are written through a status subresource (EntryStatusRoute)."""
        namespace = entry.metadata.namespace
        patch: Body = {"metadata": {"managedFields": [{}]}}
        written = await self.entry_writes.written(namespace, self.kube.patch("undoentries", *entry.key, patch))
        return UndoEntry.model_validate(written)

    async def drop_annotation(self, resource: R, key: str) -> R:
        written = await self.kube.patch(
            resource.plural, *resource.key, conditional(resource, {"metadata": {"annotations": {key: None}}})
        )
        return type(resource).model_validate(written)

    async def store_again(self, plural: Plural, namespace: str, name: str) -> None:
        """Write the object unchanged: the API stores it again, in the storage version."""
        written = self.kube.patch(plural, namespace, name, {})
        await (self.entry_writes.written(namespace, written) if plural == "undoentries" else written)

    # -- requests: what an agent (the SDK) and a person (the CLI, the dashboard) ask the operator

    async def request_outcome(self, namespace: str, name: str, outcome: Outcome, annotations: dict[str, str]) -> Saga:
        """spec.outcome, Commit or Abort (an abort's reason and failed step as annotations)."""
        patch: Body = {"spec": {"outcome": outcome.value}}
        if annotations:
            patch["metadata"] = {"annotations": annotations}
        return Saga.model_validate(await self.kube.patch("sagas", namespace, name, patch))

    async def request_rewind(self, namespace: str, name: str, request: Rewind) -> Saga:
        """spec.rewind: the entries above its position undone, then the saga handed back Active."""
        body = {"spec": {"rewind": request.model_dump(by_alias=True)}}
        return Saga.model_validate(await self.kube.patch("sagas", namespace, name, body))

    async def delete_finished(self, namespace: str, name: str, uid: str, version: str) -> None:
        """Delete a finished saga as it was read (uid and resourceVersion as preconditions: a saga
        that changed since, or one created again under its name, is not deleted); the garbage
        collector removes its entries."""
        await self.kube.delete("sagas", namespace, name, uid=uid, version=version)

    async def annotate(self, plural: Plural, namespace: str, name: str, annotations: dict[str, str]) -> Body:
        """Add annotations unconditionally (a person's or an agent's request to the operator)."""
        return await self.kube.patch(plural, namespace, name, {"metadata": {"annotations": annotations}})


def newest(a: R | None, b: R | None) -> R | None:
    """The newer of two copies of an object; None when they cannot be ordered (read it again).

    resourceVersions are opaque; etcd's are integers, and then an event that arrives while a
    write is in flight, or a write response older than an event already seen, is ordered.
    """
    if a is None or b is None:
        return a if b is None else b
    ra, rb = a.metadata.revision, b.metadata.revision
    if ra is None or rb is None:
        return None
    return a if ra >= rb else b


__all__ = [
    "EntryListing",
    "Ledger",
    "ObjectStore",
    "Unreadable",
    "changed_fields",
    "conditional",
    "newest",
    "parse_entry",
]
