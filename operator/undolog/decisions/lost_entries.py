"""Which lost entries (deleted by hand, or unreadable) a saga's status names, within its bound.

`status.lostEntries` holds at most MAX_LOST_ENTRIES entries, so that a saga whose hundreds of entries
were deleted at once still has a status the API accepts. Past the bound the entries that matter
least for the halt are left out and counted (`lostEntriesOmitted`): acknowledged ones first,
then the lowest in the stack. The decision to halt reads the unacknowledged entry highest in
the stack (phases.compensate), which is therefore always listed.
"""

from __future__ import annotations

from collections.abc import Sequence

from undolog.api import MAX_LOST_ENTRIES, LostEntry, UndoEntry


def lost_entry(entry: UndoEntry, why: str) -> LostEntry:
    """What the saga's status keeps of an entry it can no longer compensate."""
    call = entry.spec.compensation
    return LostEntry(
        name=entry.metadata.name,
        stack_position=entry.spec.stack_position,
        step=entry.spec.step,
        function=call.function if call else None,
        why=why[:1024],
    )


def _keep_first(entry: LostEntry) -> tuple[bool, int]:
    # An unknown position counts as the bottom of the stack, as it does for the halt.
    return entry.acknowledged, -(entry.stack_position or 0)


def recorded(listed: Sequence[LostEntry], omitted: int, new: Sequence[LostEntry]) -> tuple[list[LostEntry], int]:
    """`listed` (and `omitted` more) with `new` added: the entries to list, each once (as first
    reported: the watch and a write that found it gone may both report one), in the order they
    were lost, and how many are left out."""
    first: dict[str, LostEntry] = {}
    for entry in [*listed, *new]:
        first.setdefault(entry.name, entry)
    merged = list(first.values())
    if len(merged) <= MAX_LOST_ENTRIES:
        return merged, omitted
    kept = {entry.name for entry in sorted(merged, key=_keep_first)[:MAX_LOST_ENTRIES]}
    return [entry for entry in merged if entry.name in kept], omitted + len(merged) - MAX_LOST_ENTRIES
