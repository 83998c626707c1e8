"""Archive rows that lack entries, found and put right: a row an earlier release wrote without
some of its saga's entries (decisions/archive.py judges it) is written again, whole, while the
saga is still in the cluster; once it is gone that history is lost, and said so by name.
Run by the operator at start and by `undolog archive check`."""

from __future__ import annotations

from dataclasses import dataclass, field

from undolog import errors
from undolog.api import TERMINAL
from undolog.archive.record import ArchivedSaga, archived_saga
from undolog.archive.store import ArchiveStore, RowToCheck
from undolog.decisions import archive
from undolog.ledger import Ledger

GONE = "its saga is gone from the cluster"
UNFINISHED = "its saga is not finished any more (an entry registered late): archived when it finishes"


async def read_whole(ledger: Ledger, namespace: str, name: str, uid: str) -> ArchivedSaga | str:
    """The saga's row read from the API (the saga, then a consistent LIST of its entries), whole;
    else why there is none: GONE, UNFINISHED, or what is missing."""
    try:
        current = await ledger.saga(namespace, name)
    except errors.NotFound:
        return GONE
    if current.metadata.uid != uid:
        return GONE  # deleted, and another saga took its name
    if current.status.phase not in TERMINAL:
        return UNFINISHED
    listing = await ledger.entries_of(current)
    record = archived_saga(current, listing.entries)
    missing = archive.missing_in(record.saga, record.entries)
    return record if missing is None else missing


@dataclass(frozen=True)
class Mended:
    row: RowToCheck
    outcome: str  # ARCHIVED_AGAIN | SAGA_GONE | "not checked: <why>"


ARCHIVED_AGAIN = "archived again"
SAGA_GONE = "saga gone"


@dataclass
class MendReport:
    whole: int = 0  # rows found whole (marked so: not checked again)
    mended: list[Mended] = field(default_factory=list)  # the rows that were not


async def mend(store: ArchiveStore, ledger: Ledger) -> MendReport:
    """Rows an earlier release wrote without some of their entries, found and put right: each
    not known whole is judged again; a partial one whose saga is still in the cluster is
    archived again, whole; one whose saga is gone is reported (it cannot be mended) and marked."""
    report = MendReport()
    after: str | None = None
    while rows := await store.unchecked(after):
        whole = [row.uid for row in rows if row.missing is None]
        await store.mark(whole, True)
        report.whole += len(whole)
        for row in rows:
            if row.missing is not None:
                report.mended.append(Mended(row, await mended(store, ledger, row)))
        after = rows[-1].uid
    return report


async def mended(store: ArchiveStore, ledger: Ledger, row: RowToCheck) -> str:
    try:
        record = await read_whole(ledger, row.namespace, row.name, row.uid)
    except errors.KubeError as error:
        return f"not checked: {error.message}"
    if isinstance(record, ArchivedSaga):
        refused = await store.write([record], [])
        return ARCHIVED_AGAIN if not refused else f"not checked: {refused[0][1]}"
    if record == GONE:
        await store.mark([row.uid], False)
        return SAGA_GONE
    return f"not checked: {record}"
