"""Guards: an undo that never overwrites later work. What a step leaves is selected from a read
right after it (`holds`, CEL over `state`); before its compensation the same read is made again
and the compensation is sent only while the selection is what it was. Anything else is a
Conflict for a person: the later change is kept, and the entry names the fields that differ.
The selection itself is CEL (guard_expressions.py), which the SDK does without."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson

from undolog.api import GuardStatus
from undolog.api.changes import changed
from undolog.api.undo_entry import MAX_DIFFERING, MAX_GUARD_VALUE_BYTES


def digest(value: Any) -> str:
    """sha256 of the value's canonical JSON (keys sorted), as status.guard.afterDigest says it."""
    canonical = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    return "sha256:" + hashlib.sha256(canonical).hexdigest()


def same(one: Any, other: Any) -> bool:
    """Equal as JSON: Python's `==` takes False for 0 and 1 for 1.0, which JSON (and the
    digest) tell apart. Compared in place, not serialized: the walks that ask it at every
    level of an object would serialize each subtree once per level."""
    if type(one) is not type(other):
        return False
    if isinstance(one, dict):
        return one.keys() == other.keys() and all(same(value, other[key]) for key, value in one.items())
    if isinstance(one, list):
        return len(one) == len(other) and all(same(a, b) for a, b in zip(one, other, strict=True))
    if isinstance(one, float):  # JSON writes -0.0 apart from 0.0
        return one == other and math.copysign(1.0, one) == math.copysign(1.0, other)
    return bool(one == other)


def left(value: Any) -> GuardStatus:
    """What the step left, as the entry keeps it: its digest (what is compared), and the value
    itself for a person unless it is large."""
    shown = value if len(orjson.dumps(value)) <= MAX_GUARD_VALUE_BYTES else None
    return GuardStatus(after=shown, after_digest=digest(value))


@dataclass(frozen=True)
class Holds:
    """The state is still what the step left: the compensation may go."""


@dataclass(frozen=True)
class Conflicts:
    """It is not (or what the step left was never recorded): `message` for a person."""

    message: str
    differing: list[str]


Judgement = Holds | Conflicts


def judge(status: GuardStatus | None, now: Any) -> Judgement:
    """Whether `now` (what the guard's `holds` selects of the read made at the undo) is what the
    step left."""
    if status is None or status.after_digest is None:
        return Conflicts(
            "what the step left was not recorded (its read after the step failed, or the step never said it), so "
            "the undo cannot tell whether it would overwrite a later change",
            [],
        )
    if digest(now) == status.after_digest:
        return Holds()
    if status.after is None and status.after_digest != digest(None):  # not kept: large
        return Conflicts("what the step left has changed since (compared by digest: too large to show)", [])
    fields = differing(status.after, now)
    named = ", ".join(fields) or "the value"
    return Conflicts(f"what the step left has changed since: {named} differ from right after the step", fields)


def differing(after: Any, now: Any, path: str = "") -> list[str]:
    """The paths (`spec.replicas`, `rows[0].name`) where `now` differs from `after`, at most
    MAX_DIFFERING, parents before children only where the kinds differ."""
    found: list[str] = []
    _differing(after, now, path, found)
    return found[:MAX_DIFFERING]


def _differing(after: Any, now: Any, path: str, found: list[str]) -> None:
    if len(found) >= MAX_DIFFERING or same(after, now):
        return
    if isinstance(after, dict) and isinstance(now, dict):
        for key in sorted(set(after) | set(now), key=str):
            where = f"{path}.{key}" if path else str(key)
            if (key in after) != (key in now):  # added or removed (a null is not an absence)
                found.append(where[:512] or "(the whole value)")
                continue
            _differing(after[key], now[key], where, found)
        return
    if isinstance(after, list) and isinstance(now, list) and len(after) == len(now):
        for index, (a, n) in enumerate(zip(after, now, strict=True)):
            _differing(a, n, f"{path}[{index}]", found)
        return
    found.append((path or "(the whole value)")[:512])


def conflicted(status: GuardStatus | None, now: Any, judgement: Conflicts, at: datetime) -> GuardStatus:
    """The entry's guard status once a conflict is found: what the read gave now (its digest
    when it is large) and the fields that differ."""
    kept = now if len(orjson.dumps(now)) <= MAX_GUARD_VALUE_BYTES else {"sha256": digest(now)}
    return changed(status or GuardStatus(), {"now": kept, "differing": judgement.differing, "checked_at": at})


def overridden(status: GuardStatus | None, why: str) -> GuardStatus:
    """A person's `undo anyway`: the compensation goes without the check, and the entry says why."""
    return changed(status or GuardStatus(), {"overridden": why})
