"""Whether a finished saga's entries are all there, so that its archive row is whole.

The saga's status says how many entries it had when it entered its final phase
(`stackDepth`, written with that phase from entries proven complete), and for an agent's
committed saga the top of its stack at the commit (`topPosition`: entries above it came
later and are recorded, never compensated). A row is whole when it holds exactly that many
distinct positions at or below the top; anything less is a partial history, never archived
in place of the whole one, and so never the reason a saga is deleted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from typing import Any


def missing(depth: int, top: int | None, positions: Collection[int]) -> str | None:
    """Why entries at these stack positions are not the whole of a finished saga whose status
    says `depth` entries (`top`: its top at the commit); None when they are."""
    repeated = sorted(p for p, n in Counter(positions).items() if n > 1)
    if repeated:
        return f"two entries at stack position {repeated[0]}"
    counted = sum(1 for p in positions if top is None or p <= top)
    if counted == depth:
        return None
    where = f" at or below its top position {top}" if top is not None else ""
    return f"{counted} entries{where} where its status.stackDepth says {depth}"


def missing_in(saga: dict[str, Any], entries: Collection[dict[str, Any]]) -> str | None:
    """`missing` of a saga and its entries as the API has them (JSON)."""
    status = saga.get("status") or {}
    positions = [int(e.get("spec", {}).get("stackPosition", 0)) for e in entries]
    return missing(int(status.get("stackDepth") or 0), status.get("topPosition"), positions)
