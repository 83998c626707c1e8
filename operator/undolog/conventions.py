"""UndoLog's conventions in one place: names, labels, annotations, owner references, keys,
timestamps and size caps, and the one constructor of an UndoEntry (the SDK and the operator
register steps with it). Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import statistics
import time
import uuid
from collections import deque
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from undolog.api import (
    API_VERSION,
    MAX_MESSAGE,
    Call,
    Guard,
    ObjectMeta,
    ObjectUndo,
    OmittedOutput,
    OutputOmission,
    Saga,
    UndoEntry,
    UndoEntrySpec,
)
from undolog.api.common import MAX_NESTING, MAX_STEP_NAME, STEP_NAME, OwnerReference, shape, shown_integer

# -- labels, annotations, finalizer ----------------------------------------------------------------

FINALIZER = "undolog.io/compensate-before-delete"
PHASE_LABEL = "undolog.io/phase"  # the phase in lower case: `kubectl get sagas -l undolog.io/phase=halted`
ORG_LABEL = "undolog.io/org"  # spec.orgId
RETRY_ANNOTATION = "undolog.io/retry"  # on a Saga: a person's retry (the value says why)
SKIP_ANNOTATION = "undolog.io/skip"  # on an UndoEntry: a person's skip (the value says why)
# On an UndoEntry halted as Conflict: a person's "undo anyway" (the value says why), sent unchecked.
UNDO_ANYWAY_ANNOTATION = "undolog.io/undo-anyway"
# On an object a step deleted and its undo created again: which undo (undoId) did, so that the
# undo, run again after a crash, knows the object as its own.
UNDONE_BY_ANNOTATION = "undolog.io/undone-by"
ENTRY_RESOLUTIONS = (SKIP_ANNOTATION, UNDO_ANYWAY_ANNOTATION)  # what a person annotates an entry with
ABORT_REASON_ANNOTATION = "undolog.io/abort-reason"  # why the agent or person aborted (SDK, CLI)
FAILED_STEP_ANNOTATION = "undolog.io/failed-step"  # the step whose failure made the agent abort
HEADERS_SECRET_LABEL = "undolog.io/webhook-headers"  # =true: a Secret may be sent as a Webhook's headers
REPLICA_OF_LABEL = "undolog.io/replica-of"  # on a replica's own Lease: the Lease name of its operator
SHARDS_ANNOTATION = "undolog.io/shards"  # on a replica's own Lease: how many shards it drives
STORED_AS_ANNOTATION = "undolog.io/stored-as"  # on a shard's Lease: its objects were written again in this version
BUCKET_LABEL = "undolog.io/bucket"  # on a Saga and its entries: which shard drives them (decisions.sharding)

# -- buckets (sharding) ----------------------------------------------------------------------------------

BUCKETS = 64  # the most shards there can be


def bucket_of(namespace: str, saga: str) -> int:
    """The saga's bucket, and that of every entry of it: from its namespace and name only, so the
    SDK stamps it before the operator sees the object, whatever the number of shards."""
    digest = hashlib.sha256(f"{namespace}/{saga}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % BUCKETS


def bucket_labels(namespace: str, saga: str) -> dict[str, str]:
    return {BUCKET_LABEL: str(bucket_of(namespace, saga))}


_NAME_SUFFIX = "bcdfghjklmnpqrstvwxz2456789"  # as the apiserver's generateName (no vowels, no look-alikes)


def generated_name(prefix: str) -> str:
    """A name from `prefix` as `metadata.generateName` would make it, chosen here so that the
    saga's bucket is known when it is created."""
    return prefix[: MAX_NAME - 5] + "".join(secrets.choice(_NAME_SUFFIX) for _ in range(5))


# -- sizes -------------------------------------------------------------------------------------------

MAX_OUTPUT_BYTES = 16 * 1024  # a forward output kept in the ledger
IN_FLIGHT_MARK_AFTER = 0.5  # seconds a call may take before its entry is marked in flight (for people)
MAX_ANSWER_BYTES = 1024 * 1024  # read from a participant at most; the rest is never read
MAX_CALL_BYTES = 1024 * 1024  # a call's arguments sent to a participant, their references resolved
MAX_ERROR_TEXT = 300  # of an error answer's body, in lastError
MAX_EVENT_MESSAGE = 1024
MAX_NAME = 63  # a step's name, and status.failedStep


def clip(text: str, limit: int = MAX_MESSAGE) -> str:
    """Text from agents, people and participants cut to a field's bound: a write the API
    would refuse for its length must never stop a saga."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


# -- keys (the wire protocol) -------------------------------------------------------------------------


def forward_key(saga_uid: str, step: str) -> str:
    return f"{saga_uid}:{step}:fwd"


def compensation_key(undo_id: str) -> str:
    return f"undo-{undo_id}"


def effect_key(saga_uid: str, effect: str) -> str:
    return f"{saga_uid}:effect:{effect}"


# The wire protocol's refusal of a forward call whose key a compensation already named: it came
# late (a request a proxy held, a timed-out call processed after the abort), and is never applied.
LATE_FORWARD_STATUS = 410


def stable_undo_id(saga_uid: str, position: int, step: str) -> str:
    """Stable for this saga and step, new for a recreated saga: a re-registration after a crash
    finds the same entry, a saga created again under the same name gets new keys."""
    return str(uuid.uuid5(uuid.UUID(saga_uid), f"{position}:{step}"))


# -- time ------------------------------------------------------------------------------------------------


SKEW_CORRECTED_SECONDS = 2.0  # the API server's clock differing by this much is followed
SKEW_IGNORED_SECONDS = 1.0  # and by less than this, ignored again


class Clock(Protocol):
    """The one seam for time the operator's parts receive: wall time (as the API server tells
    it) and a monotonic clock for intervals. Tests give a clock of their own to make time pass."""

    def now(self) -> datetime: ...

    def monotonic(self) -> float: ...


class ClusterClock:
    """The time as the API server tells it: this process's clock plus the offset that the API's
    answers show (their `Date`), once it is SKEW_CORRECTED_SECONDS or more. Deadlines run from
    the apiserver's creationTimestamp: an operator on a node whose clock ran 20 minutes ahead
    took every saga with a 10-minute deadline for late the moment it was created, and undid it
    while its agent worked."""

    def __init__(self) -> None:
        self.offset = timedelta(0)
        self._seen: deque[float] = deque(maxlen=9)

    def observe(self, offset_seconds: float) -> None:
        """One answer's estimate of (API server's clock - ours), in seconds; the median of the
        last few is followed, so one slow answer does not move the clock."""
        self._seen.append(offset_seconds)
        typical = statistics.median(self._seen)
        if abs(typical) >= SKEW_CORRECTED_SECONDS:
            self.offset = timedelta(seconds=typical)
        elif abs(typical) < SKEW_IGNORED_SECONDS:
            self.offset = timedelta(0)

    def now(self) -> datetime:
        return datetime.now(UTC) + self.offset

    def monotonic(self) -> float:
        return time.monotonic()


CLUSTER_CLOCK = ClusterClock()


def now() -> datetime:
    return CLUSTER_CLOCK.now()


def shown_duration(span: timedelta) -> str:
    """A span the way kubectl says an age (4s, 3m, 2h, 5d); negative spans as 0s."""
    seconds = int(span.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{max(seconds, 0)}s"


def timestamp(moment: datetime | None = None) -> str:
    """RFC 3339 in UTC with microseconds, as every time UndoLog writes is formatted."""
    return (moment or now()).astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


# -- names and ownership ---------------------------------------------------------------------------------


def entry_name(saga: str, position: int) -> str:
    return f"{saga}-{position}"


def shown_url(url: str) -> str:
    """A target URL as errors and plans quote it: without `user:password@` (the CRD refuses
    them now; a Webhook admitted before still has them, and they are sent, never shown)."""
    return re.sub(r"^([a-zA-Z][a-zA-Z0-9+.-]*://)[^/?#]*@", r"\1", url)


def step_name_of(tool: str) -> str:
    """A tool's function name as the step name it gets by default: lower case, '-' for what a
    step name cannot hold, no '-' or '_' at either end (`_CreateUser` is `createuser`), within
    63 characters. Its author never chose a step name, so it is made one, not refused."""
    name = re.sub(r"[^-_a-z0-9]", "-", tool.lower())[:MAX_STEP_NAME].strip("-_")
    return name or "tool"


def repeated_step(step: str, position: int) -> str:
    """The step name of a tool called again in the same saga: its position appended, the name
    cut to leave room for it (a 63-character name worked once and failed the second time)."""
    suffix = f"-{position}"
    return step[: MAX_STEP_NAME - len(suffix)].rstrip("-_") + suffix


def step_name_refusal(step: str) -> str | None:
    """Why `step` cannot name a step (None: it can), naming it and the rule."""
    if len(step) <= MAX_STEP_NAME and re.fullmatch(STEP_NAME, step):
        return None
    return (
        f"{step[:80]!r} is not a step name: lower-case letters, digits, '-' and '_', beginning and ending "
        f"with a letter or digit, at most {MAX_STEP_NAME} characters"
    )


def owner_reference(saga_name: str, saga_uid: str) -> OwnerReference:
    """Entries are owned by their saga: deleting a finished saga removes them."""
    return OwnerReference(api_version=API_VERSION, kind="Saga", name=saga_name, uid=saga_uid, block_owner_deletion=True)


def owned_by(entry: UndoEntry, saga_uid: str) -> bool:
    """Whether the entry is this saga's: its ownerReferences carry the saga's uid. The one tie: a
    name is taken again by a saga created later (an agent resuming "job-7"), a uid never is, and
    an entry written before its saga existed cannot carry it."""
    return any(o.kind == "Saga" and o.uid == saga_uid for o in entry.metadata.owner_references)


def not_owned_why(entry: UndoEntry, saga_name: str, saga_uid: str) -> str:
    """Why the saga `entry` names will not compensate it, and what a person does about it."""
    others = [o.uid for o in entry.metadata.owner_references if o.kind == "Saga"]
    held = f"is owned by another Saga (uid {others[0]})" if others else "has no ownerReference to it"
    return (
        f"{entry.metadata.name} names saga {saga_name!r} but {held}: saga {saga_name} (uid {saga_uid}) compensates"
        " only the entries it owns. Delete this entry; if it is that saga's step, create it again with an"
        f" ownerReference to uid {saga_uid} (the SDK sets it)"
    )


def new_undo_entry(
    saga: Saga,
    position: int,
    step: str,
    compensation: Call | None,
    *,
    undo_id: str | None = None,
    registered_at: datetime | None = None,
    depends_on: list[str] | None = None,
    effect_id: str | None = None,
    guard: Guard | None = None,
    kubernetes: ObjectUndo | None = None,
) -> UndoEntry:
    """The UndoEntry that registers `step` of `saga` at `position`, before the step runs."""
    meta = saga.metadata
    return UndoEntry(
        metadata=ObjectMeta(
            name=entry_name(meta.name, position),
            namespace=meta.namespace,
            labels=bucket_labels(meta.namespace, meta.name),
            owner_references=[owner_reference(meta.name, meta.uid)],
        ),
        spec=UndoEntrySpec(
            saga=meta.name,
            undo_id=undo_id or str(uuid.uuid4()),
            stack_position=position,
            effect_id=effect_id or forward_key(meta.uid, step),
            step=step,
            compensation=compensation,
            registered_at=registered_at or now(),
            depends_on=depends_on,
            guard=guard,
            kubernetes=kubernetes,
        ),
    )


def creation_body(entry: UndoEntry) -> dict[str, Any]:
    """What is sent to create an entry: metadata and spec (status belongs to its subresource)."""
    body = entry.to_api()
    body.pop("status", None)
    metadata = {k: v for k, v in body["metadata"].items() if k in ("name", "ownerReferences", "labels")}
    body["metadata"] = metadata
    body["spec"]["registeredAt"] = timestamp(entry.spec.registered_at)
    return body


# -- outputs ------------------------------------------------------------------------------------------------


def kept_output(output: dict[str, Any] | None) -> tuple[dict[str, Any] | None, OmittedOutput | None]:
    """A forward output as the ledger keeps it: as is, or omitted (with why) when too large,
    nested too deep for UndoLog to read back, or holding a number the API would not store as it is."""
    if output is None:
        return None, None
    depth, wide = shape(output)
    if depth > MAX_NESTING:
        return None, OmittedOutput(
            reason=OutputOmission.OUTPUT_TOO_DEEP,
            message=f"the answer was a JSON object nested {depth} levels deep; the ledger keeps at most {MAX_NESTING}",
        )
    if wide is not None:  # the API would store it as a float64, rounded
        return None, OmittedOutput(
            reason=OutputOmission.ANSWER_NOT_JSON,
            message=f"the answer holds {shown_integer(wide)}, an integer beyond 64 bits the API stores rounded",
        )
    try:
        size = len(json.dumps(output, separators=(",", ":"), allow_nan=False).encode())
    except ValueError:  # NaN or an infinity (an SDK step's result): stored, it would become null
        return None, OmittedOutput(
            reason=OutputOmission.ANSWER_NOT_JSON,
            message="the answer holds NaN or an infinity, a number JSON cannot carry",
        )
    if size <= MAX_OUTPUT_BYTES:
        return output, None
    return None, OmittedOutput(
        reason=OutputOmission.OUTPUT_TOO_LARGE,
        message=f"the answer was a JSON object of {size} bytes; the ledger keeps at most {MAX_OUTPUT_BYTES}",
        size_bytes=size,
    )
