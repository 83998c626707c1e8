"""The proof that none of a saga's entries is missing, kept by its driver: how far the entries
it holds are proven complete (moves.EntryProof), and proving it from the cheapest source that
gives it. docs/design.md, "What proves that a saga's entries are all known", says why each
source proves it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from undolog import metrics
from undolog.api import LostEntry, Saga
from undolog.controller.context import DriverContext
from undolog.conventions import owned_by
from undolog.decisions import compensation_plan, phases
from undolog.decisions.lost_entries import lost_entry
from undolog.decisions.moves import EntryProof
from undolog.decisions.stack import Stack
from undolog.kube.watch import Progress
from undolog.ledger import EntryListing

WATCH_PROOF_WAIT = 5.0  # seconds a proof waits for the entry watch before it lists instead


@dataclass(frozen=True, slots=True)
class Listed:
    """A saga's copy as the informer listed it on taking charge (its resourceVersion), and when
    that listing was sent: the entry listing taken just after proves what the copy showed by then."""

    resource_version: str
    at: datetime


class ProofSource(StrEnum):
    """Where a proof that a saga's entries are all known came from (`prove`)."""

    TAKING_CHARGE = "TakingCharge"
    WATCH = "Watch"
    WRITE_ECHO = "WriteEcho"
    LIST = "List"


# Listings a proof no longer needs, held until they finish (a task nobody holds may be collected).
_UNREAD: set[asyncio.Future[EntryListing]] = set()


def _left_unread(listing: asyncio.Future[EntryListing]) -> None:
    _UNREAD.discard(listing)
    if not listing.cancelled():
        listing.exception()  # retrieved: an error nobody waits for is not one to log


class EntryProver:
    """One saga's proof. A new driver starts without one: only a listing taken after the saga
    failed proves it (or the entry watch once past a later write)."""

    __slots__ = ("context", "key", "listed", "proof")

    def __init__(self, context: DriverContext, namespace: str, name: str) -> None:
        self.context, self.key = context, (namespace, name)
        self.proof = EntryProof.NONE
        self.listed: Listed | None = None  # on taking charge, just before the entries were listed

    def aged(self) -> None:
        """Time passed or a call was made since the listing: something may have come meanwhile."""
        if self.proof == EntryProof.FRESH:
            self.proof = EntryProof.STALE

    def forget(self) -> None:
        self.proof = EntryProof.NONE

    def relisted(self, before: Saga, after: Saga) -> None:
        """The saga's labels or finalizers were written conditionally on the copy listed on
        taking charge: the new copy shows what the listed one did, and the listing proves it still."""
        if self.listed is not None and self.listed.resource_version == before.metadata.resource_version:
            self.listed = Listed(after.metadata.resource_version, self.listed.at)

    async def prove(self, saga: Saga, entries: Stack) -> list[LostEntry]:
        """Prove `entries` complete (and replace them with what proves it), from the cheapest
        source (a LIST scans every entry of the namespace in the apiserver: one per saga made
        resuming 10,000 sagas quadratic):
        - for the saga's copy listed on taking charge: the entry listing taken just after it;
        - after calls: the entry watch, once it has applied its stream up to the saga's newest
          entry write (made after the last call), which is as good as a LIST taken then;
        - else a consistent LIST of the saga's entries, raced with the entry watch's echo of
          the next entry write sent from now on, any saga's (ledger.EntryWrites): with sagas
          failing together the LISTs wait up to 100 ms for the apiserver's cache, while another
          saga's call outcome is written in ~10. Returned: what the index held and the listing
          lacks (deleted), and what cannot be read."""
        listed = self.listed
        if (
            self.proof == EntryProof.NONE
            and listed is not None
            and saga.metadata.resource_version == listed.resource_version
            and phases.proof_due_by(saga, listed.at)
        ):
            self._proven(ProofSource.TAKING_CHARGE, EntryProof.STALE)
            return []
        if self.proof == EntryProof.STALE and await self.watched_past(entries):
            self.take_indexed(saga, entries)
            return []
        ledger = self.context.ledger
        progress = self.context.informer.entries_seen(self.key[0])
        mark = ledger.entry_writes.mark()
        listing = asyncio.ensure_future(ledger.entries_of(saga))
        if progress is not None and await self.echoed_before(listing, progress, mark):
            self.take_indexed(saga, entries, ProofSource.WRITE_ECHO)
            return []
        metrics.series.of(metrics.entry_proofs, self.key[0], ProofSource.LIST).inc()
        answer = await listing
        lost = [
            lost_entry(gone, "deleted by hand")
            for gone in self.context.index.replace(self.key, answer.entries + answer.unowned)
            if owned_by(gone, saga.metadata.uid) and gone.status.state not in compensation_plan.SETTLED
        ]
        entries.replace(answer.entries)
        self.proof = EntryProof.FRESH
        return lost + [unreadable.lost for unreadable in answer.unreadable]

    def take_indexed(self, saga: Saga, entries: Stack, source: ProofSource = ProofSource.WATCH) -> None:
        """The saga's entries as the index holds them, proven complete by the watch."""
        held = self.context.index.of(self.key)
        entries.replace(e for e in held.values() if owned_by(e, saga.metadata.uid))
        self._proven(source, EntryProof.FRESH)

    def _proven(self, source: ProofSource, proof: EntryProof) -> None:
        metrics.series.of(metrics.entry_proofs, self.key[0], source).inc()
        self.proof = proof

    async def echoed_before(self, listing: asyncio.Future[EntryListing], progress: Progress, mark: int) -> bool:
        """Whether the entry watch applies an entry write of the namespace sent after `mark`
        before `listing` answers. The listing is then left to finish unread: cancelled, its
        connection to the apiserver would be closed and opened again."""

        async def echoed() -> bool:
            revision = await self.context.ledger.entry_writes.next_after(mark, self.key[0])
            return await progress.reached(revision, WATCH_PROOF_WAIT)

        echo = asyncio.ensure_future(echoed())
        try:
            await asyncio.wait((listing, echo), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            listing.cancel()
            raise
        finally:
            echo.cancel()
        if not (echo.done() and not echo.cancelled() and echo.result()):
            return False
        _UNREAD.add(listing)
        listing.add_done_callback(_left_unread)
        return True

    async def watched_past(self, entries: Stack) -> bool:
        """Whether the watch of every entry of the namespace reaches the newest write of these
        entries within WATCH_PROOF_WAIT (deletions and unreadable entries up to there have then
        been reported to this driver too)."""
        progress = self.context.informer.entries_seen(self.key[0])
        revisions = [e.metadata.revision for e in entries]
        if progress is None or not revisions:
            return False
        known = [r for r in revisions if r is not None]
        return len(known) == len(revisions) and await progress.reached(max(known), WATCH_PROOF_WAIT)
