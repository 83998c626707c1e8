"""The named changes of an entry's status (decisions/entry_changes.py): one definition each."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from undolog.api import EffectState, EntryReason, EntryState, UndoEntryStatus
from undolog.api.changes import changed
from undolog.decisions import entry_changes


def test_a_skip_settles_the_entry_with_why_and_by_a_rewind_as_history() -> None:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    skipped = changed(UndoEntryStatus(), entry_changes.skipped(EntryReason.SKIPPED_BY_PERSON, "refunded by hand"))
    assert (skipped.state, skipped.reason, skipped.skip_reason, skipped.rewound_at) == (
        EntryState.SKIPPED,
        EntryReason.SKIPPED_BY_PERSON,
        "refunded by hand",
        None,
    )
    assert entry_changes.skipped(EntryReason.SKIPPED_BY_PERSON, "x", rewound_at=at)["rewound_at"] == at


@pytest.mark.parametrize(
    ("status", "forward", "after"),
    [
        (
            UndoEntryStatus(state=EntryState.FAILED, retry_count=3, reason=EntryReason.CERTIFICATE_REJECTED),
            False,
            (EntryState.PENDING, 0, None),
        ),
        (UndoEntryStatus(state=EntryState.COMPENSATED), False, None),
        (
            UndoEntryStatus(effect=EffectState.FAILED, reason=EntryReason.CERTIFICATE_REJECTED),
            True,
            (EntryState.PENDING, 0, None),
        ),
        (UndoEntryStatus(effect=EffectState.FAILED, state=EntryState.SKIPPED), True, None),
        (UndoEntryStatus(effect=EffectState.COMMITTED), True, None),
    ],
)
def test_a_retry_puts_back_only_what_failed(
    status: UndoEntryStatus, forward: bool, after: tuple[EntryState, int, EntryReason | None] | None
) -> None:
    change = entry_changes.retried(status, resume_forward=forward)
    if after is None:
        assert change is None
        return
    assert change is not None
    again = changed(status, change)
    assert (again.state, again.retry_count, again.reason) == after
    if forward:
        assert again.effect == EffectState.PENDING
