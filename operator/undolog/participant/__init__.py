"""UndoLog's participant kit (`pip install undolog[participant]`): the barrier that keeps every
rule of the wire protocol (Idempotency-Key, the compensation of a call never seen, the late
forward, signatures, fences) in the participant's own database transaction, with its effect."""

from undolog.conventions import LATE_FORWARD_STATUS
from undolog.participant.barrier import Answer, Barrier, Call, Ledger
from undolog.participant.store import PostgresLedger, SqliteLedger, postgres_transaction, sqlite_transaction
from undolog.participant.web import aiohttp_handler, asgi_app

__all__ = [
    "LATE_FORWARD_STATUS",
    "Answer",
    "Barrier",
    "Call",
    "Ledger",
    "PostgresLedger",
    "SqliteLedger",
    "aiohttp_handler",
    "asgi_app",
    "postgres_transaction",
    "sqlite_transaction",
]
