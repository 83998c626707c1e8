"""Guards: what a step left is compared by digest, the differing fields named, the selection in CEL."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from undolog.api import GuardStatus, UndoEntryStatus
from undolog.api.undo_entry import MAX_DIFFERING, MAX_GUARD_VALUE_BYTES
from undolog.decisions import entry_changes, guard_expressions, guards

AT = datetime(2026, 12, 6, tzinfo=UTC)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=12,
)


@given(json_values)
def test_what_the_step_left_holds_again_whatever_it_is(value: Any) -> None:
    assert guards.judge(guards.left(value), value) == guards.Holds()


@given(json_values, json_values)
def test_any_change_is_a_conflict_and_names_where_when_it_can(after: Any, now: Any) -> None:
    judgement = guards.judge(guards.left(after), now)
    if guards.digest(after) == guards.digest(now):
        assert judgement == guards.Holds()
    else:
        assert isinstance(judgement, guards.Conflicts)
        assert judgement.differing  # the value is kept (small): some field is named
        assert len(judgement.differing) <= MAX_DIFFERING


def test_the_fields_named_are_those_that_differ_and_others_are_not() -> None:
    after = {"replicas": 5, "labels": {"tier": "silver", "app": "web"}, "ports": [80, 443]}
    now = {"replicas": 10, "labels": {"tier": "bronze", "app": "web"}, "ports": [80, 443]}
    judgement = guards.judge(guards.left(after), now)
    assert isinstance(judgement, guards.Conflicts)
    assert judgement.differing == ["labels.tier", "replicas"]
    assert "labels.tier, replicas differ" in judgement.message


def test_nothing_recorded_is_a_conflict_never_a_pass() -> None:
    """A step whose read after it failed: the undo cannot tell, so a person decides."""
    for status in (None, GuardStatus()):
        judgement = guards.judge(status, {"anything": 1})
        assert isinstance(judgement, guards.Conflicts)
        assert "was not recorded" in judgement.message


def test_a_null_state_is_recorded_and_compared_too() -> None:
    """The file did not exist after the step (null): its digest is kept, and null holds again."""
    assert guards.judge(guards.left(None), None) == guards.Holds()
    assert isinstance(guards.judge(guards.left(None), "written since"), guards.Conflicts)


def test_a_large_value_is_kept_by_digest_alone_and_still_compared() -> None:
    large = {"text": "x" * (MAX_GUARD_VALUE_BYTES + 1)}
    status = guards.left(large)
    assert status.after is None
    assert status.after_digest is not None
    assert guards.judge(status, large) == guards.Holds()
    judgement = guards.judge(status, {"text": "y"})
    assert isinstance(judgement, guards.Conflicts)
    assert "too large to show" in judgement.message
    conflicted = guards.conflicted(status, {"text": "z" * (MAX_GUARD_VALUE_BYTES + 1)}, judgement, AT)
    assert conflicted.now == {"sha256": guards.digest({"text": "z" * (MAX_GUARD_VALUE_BYTES + 1)})}


def test_undo_anyway_owes_the_entry_again_and_keeps_what_was_seen() -> None:
    seen = guards.conflicted(guards.left({"a": 1}), {"a": 2}, guards.Conflicts("m", ["a"]), AT)
    change = entry_changes.undone_anyway(UndoEntryStatus(guard=seen), "asked by the owner")
    assert (change["state"], change["reason"]) == ("Pending", None)
    guard = change["guard"]
    assert guard is not None
    assert guard.overridden == "asked by the owner"
    assert (guard.after, guard.now, guard.differing) == ({"a": 1}, {"a": 2}, ["a"])


def test_holds_selects_in_cel_and_a_bad_expression_is_named() -> None:
    state = {"spec": {"replicas": 5, "template": {}}, "metadata": {"labels": {"tier": "gold"}}}
    assert guard_expressions.selected("state.spec.replicas", state) == 5
    assert guard_expressions.selected("{'r': state.spec.replicas, 't': state.metadata.labels.tier}", state) == {
        "r": 5,
        "t": "gold",
    }
    assert guard_expressions.selected(None, state) == state
    with pytest.raises(guard_expressions.ExpressionError, match=r"state\.spec\.nope"):
        guard_expressions.selected("state.spec.nope", state)
    with pytest.raises(guard_expressions.ExpressionError, match="does not compile"):
        guard_expressions.check("state.(")
