"""The saga handle of MCP's stateless revision (2026-07-28): what the gateway mints when a
mapped call opens a saga, and the agent passes back as a tool argument to add steps to it,
commit, abort or rewind it. It names the saga (namespace, name, UID) and the client identity it
was minted for, and is signed with the gateway's key (HMAC-SHA256), so it cannot be guessed or
forged from a saga's name, nor used by another authenticated client; what it stands for lives
in the ledger, so any gateway replica with the key serves it, across restarts.

Pure: the key and the identity are given; nothing here reads the API.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from dataclasses import dataclass

PREFIX = "uls1"  # the handle format's version
ANONYMOUS = ""  # the identity of an unauthenticated client


@dataclass(frozen=True)
class SagaHandle:
    namespace: str
    name: str
    uid: str


@dataclass(frozen=True)
class HandleRefusal:
    """Why a handle is refused (nothing is called): `malformed`, `forged` or `foreign`."""

    kind: str
    message: str


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _who(identity: str | None) -> str:
    """The client identity a handle is bound to, as the handle carries it (a digest)."""
    return hashlib.sha256((identity or ANONYMOUS).encode()).hexdigest()[:16]


def _mac(key: bytes, payload: str) -> str:
    return _b64(hmac.new(key, f"{PREFIX}.{payload}".encode(), hashlib.sha256).digest())


def mint(key: bytes, saga: SagaHandle, identity: str | None) -> str:
    """The handle of `saga` for the client `identity` (None: an unauthenticated one)."""
    body = {"ns": saga.namespace, "name": saga.name, "uid": saga.uid, "who": _who(identity)}
    payload = _b64(json.dumps(body, separators=(",", ":"), sort_keys=True).encode())
    return f"{PREFIX}.{payload}.{_mac(key, payload)}"


def opened(key: bytes, text: str, identity: str | None, namespace: str) -> SagaHandle | HandleRefusal:
    """The saga a handle stands for, for this caller (`identity`) in its namespace; or why not."""
    parts = text.split(".") if isinstance(text, str) else []
    if len(parts) != 3 or parts[0] != PREFIX:
        return HandleRefusal("malformed", f"{_shown(text)} is not a saga handle this gateway minted ({PREFIX}.…)")
    payload, mac = parts[1], parts[2]
    if not hmac.compare_digest(_mac(key, payload), mac):
        return HandleRefusal("forged", f"{_shown(text)} is not signed by this gateway's key: refused")
    try:
        body = json.loads(_unb64(payload))
        handle = SagaHandle(str(body["ns"]), str(body["name"]), str(body["uid"]))
        who = str(body["who"])
    except (binascii.Error, ValueError, KeyError, TypeError):
        return HandleRefusal("malformed", f"{_shown(text)} does not hold a saga")
    if not hmac.compare_digest(who, _who(identity)):
        return HandleRefusal("foreign", "the handle was minted for another client identity")
    if handle.namespace != namespace:
        return HandleRefusal(
            "foreign", f"the handle is of namespace {handle.namespace}, not the caller's ({namespace})"
        )
    return handle


def _shown(text: object) -> str:
    shown = repr(text)
    return shown if len(shown) <= 60 else shown[:57] + "…'"


# A mapped call the server answered `input_required`: its step stays registered and open, and the
# agent's retry (which carries this as its requestState) is recorded on it, under the same
# Idempotency-Key. The server's own state rides inside; signed, so an agent cannot move a retry
# to another step or claim a confirmation the user never gave.
ROUND_PREFIX = "ulr1"


@dataclass(frozen=True)
class OpenRound:
    handle: str  # the saga's handle
    position: int  # the step registered for the call
    state: str | None  # the server's requestState, passed back to it
    confirmed: bool  # the user allowed the call (confirm: true) before the server asked


def _round_mac(key: bytes, payload: str) -> str:
    return _b64(hmac.new(key, f"{ROUND_PREFIX}.{payload}".encode(), hashlib.sha256).digest())


def seal_round(key: bytes, round_: OpenRound) -> str:
    body = {"h": round_.handle, "p": round_.position, "s": round_.state, "c": round_.confirmed}
    payload = _b64(json.dumps(body, separators=(",", ":"), sort_keys=True).encode())
    return f"{ROUND_PREFIX}.{payload}.{_round_mac(key, payload)}"


def opened_round(key: bytes, text: str | None) -> OpenRound | HandleRefusal | None:
    """The open round a retry's requestState stands for; None when it is not one the gateway
    sealed (a server's own state, passed through as it is)."""
    parts = text.split(".") if isinstance(text, str) else []
    if len(parts) != 3 or parts[0] != ROUND_PREFIX:
        return None
    if not hmac.compare_digest(_round_mac(key, parts[1]), parts[2]):
        return HandleRefusal("forged", "requestState is not signed by this gateway's key: refused")
    try:
        body = json.loads(_unb64(parts[1]))
        state = body["s"]
        return OpenRound(str(body["h"]), int(body["p"]), None if state is None else str(state), body["c"] is True)
    except (binascii.Error, ValueError, KeyError, TypeError):
        return HandleRefusal("malformed", "requestState does not hold an open round")


# A task an upstream runs for an agent (the tasks extension): the agent sees this in place of the
# server's task id, so that its tasks/get, tasks/update and tasks/cancel reach the upstream that
# runs it, from the caller it was started for only; with the step it belongs to, when the call
# was a mapped step (its outcome is recorded when the task ends).
TASK_PREFIX = "ult1"


@dataclass(frozen=True)
class UpstreamTask:
    upstream: str
    task_id: str  # the server's own
    saga: str | None = None  # of a mapped step: its saga (namespace/name) and its position
    position: int | None = None


def _task_mac(key: bytes, payload: str) -> str:
    return _b64(hmac.new(key, f"{TASK_PREFIX}.{payload}".encode(), hashlib.sha256).digest())


def seal_task(key: bytes, task: UpstreamTask, identity: str | None) -> str:
    body = {"u": task.upstream, "t": task.task_id, "s": task.saga, "p": task.position, "who": _who(identity)}
    payload = _b64(json.dumps(body, separators=(",", ":"), sort_keys=True).encode())
    return f"{TASK_PREFIX}.{payload}.{_task_mac(key, payload)}"


def opened_task(key: bytes, text: str, identity: str | None) -> UpstreamTask | HandleRefusal:
    """The upstream task a gateway task id stands for, for this caller; or why not."""
    parts = text.split(".") if isinstance(text, str) else []
    if len(parts) != 3 or parts[0] != TASK_PREFIX:
        return HandleRefusal("malformed", f"{_shown(text)} is not a task this gateway started ({TASK_PREFIX}.…)")
    if not hmac.compare_digest(_task_mac(key, parts[1]), parts[2]):
        return HandleRefusal("forged", f"{_shown(text)} is not signed by this gateway's key: refused")
    try:
        body = json.loads(_unb64(parts[1]))
        saga, position = body["s"], body["p"]
        task = UpstreamTask(
            str(body["u"]),
            str(body["t"]),
            None if saga is None else str(saga),
            None if position is None else int(position),
        )
        who = str(body["who"])
    except (binascii.Error, ValueError, KeyError, TypeError):
        return HandleRefusal("malformed", f"{_shown(text)} does not hold a task")
    if not hmac.compare_digest(who, _who(identity)):
        return HandleRefusal("foreign", "the task was started for another client identity")
    return task
