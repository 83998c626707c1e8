"""The undo of a change to a Kubernetes object, decided from three images of it: before the
step, right after it, and now. Only what the step changed is undone, and only where nothing
changed it again since: a later change to the same field is a Conflict for a person, a later
change elsewhere is kept. Server-owned fields (status, uid, resourceVersion, generation,
managedFields, ...) are never compared and never written."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from undolog.api import GuardStatus
from undolog.api.undo_entry import MAX_DIFFERING, MAX_OBJECT_BYTES
from undolog.conventions import UNDONE_BY_ANNOTATION
from undolog.decisions.arguments import within
from undolog.decisions.guards import digest, same

Manifest = dict[str, Any]
Path = tuple[str, ...]

# Set by the API server, never by a writer: dropped from every image before anything is compared.
SERVER_METADATA = (
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "selfLink",
)
# Written by controllers in answer to a change, not by whoever changed the object.
CONTROLLER_ANNOTATIONS = ("deployment.kubernetes.io/revision",)


def kept(manifest: Manifest) -> Manifest:
    """The object as its writers wrote it: without its status and server-set metadata."""
    written = copy.deepcopy(manifest)
    written.pop("status", None)
    metadata = written.get("metadata")
    if isinstance(metadata, dict):
        for name in SERVER_METADATA:
            metadata.pop(name, None)
        annotations = metadata.get("annotations")
        if isinstance(annotations, dict):
            for name in CONTROLLER_ANNOTATIONS:
                annotations.pop(name, None)
            if not annotations:
                metadata.pop("annotations")
    return written


_ABSENT = object()


def at(manifest: Any, path: Path) -> Any:
    """The value at `path`, or _ABSENT."""
    for key in path:
        if not isinstance(manifest, dict) or key not in manifest:
            return _ABSENT
        manifest = manifest[key]
    return manifest


def changed_paths(old: Manifest, new: Manifest) -> list[Path]:
    """Where `new` differs from `old`: maps are walked into, a list is one value (a change to one
    container is a change to the list of containers)."""
    found: list[Path] = []
    _changed(old, new, (), found)
    return found


def _changed(old: Any, new: Any, path: Path, found: list[Path]) -> None:
    if old is _ABSENT or new is _ABSENT:
        if old is not new:
            found.append(path)
        return
    if same(old, new):
        return
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new)):
            _changed(old.get(key, _ABSENT), new.get(key, _ABSENT), (*path, key), found)
        return
    found.append(path)


def shown(path: Path) -> str:
    """A path as a person reads it: spec.replicas, metadata.labels["app.kubernetes.io/name"]."""
    said = ""
    for key in path:
        said += f'["{key}"]' if "." in key or "/" in key else f".{key}" if said else key
    return said[:512]


def pointer(path: Path) -> str:
    """A JSON pointer (RFC 6901) to `path`."""
    return "".join("/" + key.replace("~", "~0").replace("/", "~1") for key in path)


@dataclass(frozen=True)
class AlreadyUndone:
    """Nothing to write: the object is as it was before the step (or the step changed nothing)."""

    why: str


@dataclass(frozen=True)
class Delete:
    """The object the step created, still as it left it: deleted, only if it is that very copy."""

    uid: str
    resource_version: str


@dataclass(frozen=True)
class Create:
    """The object the step deleted, created again from its before-image (server fields dropped)."""

    manifest: Manifest


@dataclass(frozen=True)
class Restore:
    """A JSON patch putting back what the step changed, applied only to the copy read now."""

    operations: list[dict[str, Any]]
    paths: list[str]


@dataclass(frozen=True)
class Conflict:
    """Undoing would overwrite a later change: `message` for a person, `differing` the fields."""

    message: str
    differing: list[str]


Undo = AlreadyUndone | Delete | Create | Restore | Conflict


def undo(
    before: Manifest | None,
    after: Manifest | None,
    now: Manifest | None,
    *,
    undone_by: str,
    changes: Manifest | None = None,
    anyway: bool = False,
) -> Undo:
    """What to write to undo the step that took the object from `before` to `after` (None:
    absent), given it is `now` (None: absent). `changes`: the shape of what the step writes (a
    merge patch's: its leaves are the fields), so that a change another writer made while the
    step ran is not taken for the step's; None: any field. `undone_by` marks an object this undo
    creates again (its undoId), `anyway`: a person accepts overwriting later changes to the
    fields the step changed."""
    if before is None and after is None:
        return AlreadyUndone("the object did not exist before the step nor after it")
    if now is None:
        if before is None:
            return AlreadyUndone("the object the step created is gone already")
        if after is None:
            return Create(recreated(before, undone_by))
        return Conflict("the object was deleted since the step changed it", [])
    if before is None:
        assert after is not None  # both absent is answered above
        return _created(after, now, anyway)
    if after is None:
        if _annotations(now).get(UNDONE_BY_ANNOTATION) == undone_by:
            return AlreadyUndone("this undo created it again already")
        return Conflict("an object of that name was created again since the step deleted it", [])
    return _restored(before, after, now, changes, anyway)


def _annotations(manifest: Manifest) -> dict[str, Any]:
    found = (manifest.get("metadata") or {}).get("annotations")
    return found if isinstance(found, dict) else {}


def _uid(manifest: Manifest) -> str:
    return str((manifest.get("metadata") or {}).get("uid") or "")


def _version(manifest: Manifest) -> str:
    return str((manifest.get("metadata") or {}).get("resourceVersion") or "")


def _created(after: Manifest, now: Manifest, anyway: bool) -> Undo:
    if _uid(now) != _uid(after):
        return Conflict("the object the step created was deleted and created again since (another uid)", [])
    since = [shown(p) for p in changed_paths(kept(after), kept(now))]
    if since and not anyway:
        return Conflict(f"the object the step created was changed since: {', '.join(since)}", since[:MAX_DIFFERING])
    return Delete(_uid(now), _version(now))


def _restored(before: Manifest, after: Manifest, now: Manifest, changes: Manifest | None, anyway: bool) -> Undo:
    if _uid(now) != _uid(after):
        return Conflict("the object was deleted and created again since the step changed it (another uid)", [])
    old, new, current = kept(before), kept(after), kept(now)
    paths = [p for p in changed_paths(old, new) if changes is None or _within(p, changes)]
    if not paths:
        return AlreadyUndone("the step changed none of the object's fields")
    # A field set back to its value before the step since is no conflict: nothing would be lost.
    differing = [
        shown(p) for p in paths if not _one_of(at(current, p), at(new, p), at(old, p)) or _under_a_value(current, p)
    ]
    if differing and not anyway:
        return Conflict(
            f"changed again since the step: {', '.join(differing)} (the other fields the step changed are as it "
            "left them)",
            differing[:MAX_DIFFERING],
        )
    target = copy.deepcopy(current)
    for path in paths:
        _put(target, path, at(old, path))
    writes = changed_paths(current, target)
    if not writes:
        return AlreadyUndone("every field the step changed is back as it was before")
    operations: list[dict[str, Any]] = [{"op": "test", "path": "/metadata/resourceVersion", "value": _version(now)}]
    operations.extend(_operation(p, at(target, p), at(current, p)) for p in writes)
    return Restore(operations, [shown(p) for p in writes])


def _one_of(value: Any, *candidates: Any) -> bool:
    """Whether `value` is one of `candidates` as JSON (or absent where one is)."""
    return any(value is c or (value is not _ABSENT and c is not _ABSENT and same(value, c)) for c in candidates)


def _within(path: Path, shape: Any) -> bool:
    """Whether `path` is a field the shape names: on the way to one of its leaves, or under one."""
    for key in path:
        if not isinstance(shape, dict):
            return True  # under a leaf the step writes whole
        if key not in shape:
            return False
        shape = shape[key]
    return True


def _under_a_value(manifest: Manifest, path: Path) -> bool:
    """Whether something on the way to `path` is a value, not a map (set so since the step)."""
    for depth in range(1, len(path)):
        found = at(manifest, path[:depth])
        if found is not _ABSENT and not isinstance(found, dict):
            return True
    return False


def _put(manifest: Manifest, path: Path, value: Any) -> None:
    """Set (or, _ABSENT, remove) the value at `path`, making the maps on the way."""
    for key in path[:-1]:
        child = manifest.get(key)
        if not isinstance(child, dict):
            child = manifest[key] = {}
        manifest = child
    if value is _ABSENT:
        manifest.pop(path[-1], None)
    else:
        manifest[path[-1]] = copy.deepcopy(value)


def _operation(path: Path, value: Any, current: Any) -> dict[str, Any]:
    if value is _ABSENT:
        return {"op": "remove", "path": pointer(path)}
    if current is _ABSENT:
        return {"op": "add", "path": pointer(path), "value": value}
    return {"op": "replace", "path": pointer(path), "value": value}


def recreated(before: Manifest, undone_by: str) -> Manifest:
    """A deleted object's before-image as a create request: what its writers wrote, marked as
    this undo's."""
    manifest = kept(before)
    metadata = manifest.setdefault("metadata", {})
    metadata["annotations"] = {**_annotations(manifest), UNDONE_BY_ANNOTATION: undone_by}
    return manifest


def left(after: Manifest | None) -> GuardStatus | None:
    """The object right after the step (None: absent), as its entry keeps it; unkept (None) when
    larger than MAX_OBJECT_BYTES: its undo then halts as Conflict for a person."""
    if after is not None and not within(after, MAX_OBJECT_BYTES):
        return None
    return GuardStatus(after=after, after_digest=digest(after))


def conflicting_fields(
    before: Manifest | None, after: Manifest | None, now: Manifest | None
) -> list[tuple[str, Any, Any, Any]]:
    """Each field the step changed that changed again since: its name, and its value before the
    step, right after it and now (None where absent), for the person who decides."""
    old, new, current = (kept(m) if m is not None else {} for m in (before, after, now))
    found: list[tuple[str, Any, Any, Any]] = []
    for path in changed_paths(old, new):
        was, left, is_now = (None if v is _ABSENT else v for v in (at(image, path) for image in (old, new, current)))
        if not _one_of(at(current, path), at(old, path), at(new, path)):
            found.append((shown(path), was, left, is_now))
    return found[:MAX_DIFFERING]
