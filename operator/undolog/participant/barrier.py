"""The participant's barrier: every rule the operator relies on, kept in the participant's own
database transaction, with the effect (DTM's sub-transaction barrier, for UndoLog's wire
protocol). One table of the calls seen, by Idempotency-Key, and one of the highest fence seen
per shard; a call and its effect commit together or not at all, so a crash anywhere leaves both
or neither.

- A forward call's key seen before: its first answer again, nothing applied twice.
- A compensation of a forward key never seen: nothing to undo, answered 2xx, and the key is
  recorded as compensated, so the forward call arriving after it (a request a proxy held, a
  timed-out call processed late) is refused `410 Gone` and never applied.
- A compensation's key seen before: its first answer again.
- With the Webhook's signing secrets: a call not signed as the operator signs it is refused 401.
- `Undolog-Fence` lower than the highest seen for its `Undolog-Shard`: refused 409 (an operator
  replaced while frozen); the highest is recorded in the same transaction.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from undolog.conventions import LATE_FORWARD_STATUS

KEY = "idempotency-key"
FORWARD_KEY = "undolog-forward-key"
FENCE, SHARD = "undolog-fence", "undolog-shard"


@dataclass(frozen=True)
class Answer:
    status: int
    body: Any

    def encoded(self) -> bytes:
        return json.dumps(self.body).encode()


@dataclass(frozen=True)
class Call:
    """An operator's call as the participant received it: its headers (any case) and body."""

    headers: Mapping[str, str]
    body: bytes

    def header(self, name: str) -> str | None:
        for key, value in self.headers.items():
            if key.lower() == name:
                return value
        return None

    @property
    def args(self) -> Any:
        return json.loads(self.body or b"null")


class Fences(Protocol):
    async def fence(self, shard: str, fence: int) -> int:
        """Record the fence if it is the highest of its shard; the highest after."""


class Ledger(Fences, Protocol):
    """The barrier's two tables in the participant's open transaction (store.py: PostgreSQL
    through psycopg, SQLite)."""

    async def claim(self, key: str, kind: str, forward_key: str | None) -> tuple[str, Answer | None] | None:
        """Record `key` as `kind`; None when this call claimed it, else (its kind, its answer)."""

    async def answered(self, key: str, answer: Answer) -> None: ...

    async def find(self, key: str) -> tuple[str, Answer | None] | None: ...


Apply = Callable[[Any], Awaitable[Answer]]  # a forward call's effect, in the transaction
Undo = Callable[[Any, Answer], Awaitable[Answer]]  # a compensation, with the forward call's answer


class Barrier:
    def __init__(self, signing_secrets: list[str] | None = None) -> None:
        self.verifiers = [_verifier(s) for s in signing_secrets or []]

    def refused(self, call: Call) -> Answer | None:
        """A call that is not the operator's: its signature does not verify (with secrets)."""
        if not self.verifiers:
            return None
        for verifier in self.verifiers:
            try:
                verifier.verify(call.body, dict(call.headers))
                return None
            except Exception:  # standardwebhooks raises its own error for every kind of mismatch
                continue
        return Answer(401, {"error": "the call is not signed as the operator signs it"})

    async def stale(self, fences: Fences, call: Call) -> Answer | None:
        """A call whose fence is lower than the highest its shard has seen (recorded in `fences`)."""
        fence, shard = call.header(FENCE), call.header(SHARD) or "0/1"
        if fence is None or not fence.isdigit():
            return None
        highest = await fences.fence(shard, int(fence))
        if highest > int(fence):
            return Answer(409, {"error": f"stale fence {fence}: shard {shard} has seen {highest}"})
        return None

    async def forward(self, ledger: Ledger, call: Call, apply: Apply) -> Answer:
        """The forward call, once, in the ledger's transaction."""
        key = call.header(KEY)
        if key is None:
            return Answer(400, {"error": "no Idempotency-Key"})
        refused = self.refused(call) or await self.stale(ledger, call)
        if refused is not None:
            return refused
        seen = await ledger.claim(key, "forward", None)
        if seen is not None:
            kind, answer = seen
            if kind == "compensated":
                return Answer(LATE_FORWARD_STATUS, {"error": "compensated before it arrived: not applied", "key": key})
            return answer or Answer(409, {"error": "the same call is being applied"})
        answer = await apply(call.args)
        await ledger.answered(key, answer)
        return answer

    async def compensate(self, ledger: Ledger, call: Call, undo: Undo) -> Answer:
        """The compensation, once; a forward call never seen is marked so it is never applied."""
        key, forward = call.header(KEY), call.header(FORWARD_KEY)
        if key is None or forward is None:
            return Answer(400, {"error": "no Idempotency-Key or Undolog-Forward-Key"})
        refused = self.refused(call) or await self.stale(ledger, call)
        if refused is not None:
            return refused
        seen = await ledger.claim(key, "compensation", forward)
        if seen is not None:
            return seen[1] or Answer(409, {"error": "the same compensation is being applied"})
        applied = await ledger.claim(forward, "compensated", None)
        if applied is None or applied[0] == "compensated":  # never seen: nothing to undo, and never to come
            answer = Answer(200, {"compensated": False, "why": "the forward call was never applied"})
        else:
            answer = await undo(call.args, applied[1] or Answer(200, None))
        await ledger.answered(key, answer)
        return answer


def _verifier(secret: str) -> Any:
    from standardwebhooks import Webhook  # only with secrets: what a participant verifying has installed

    return Webhook(secret)
