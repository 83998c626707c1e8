"""The rules of the house that a reader relies on: every move the state machine can decide has
its applier, no unit outgrows what one reader holds in mind (devtools/sizes.py), and every
change of state is typed (api/changes.py)."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest
from devtools import sizes
from pydantic import BaseModel

from undolog.api import EntryState, UndoEntryStatus
from undolog.api.changes import CHANGES, changed
from undolog.controller import applying
from undolog.decisions import moves


def test_every_move_but_wait_has_one_applier() -> None:
    decided = set(typing.get_args(moves.Move)) - {moves.Wait}
    assert set(applying.APPLIERS) == decided


def test_no_class_over_300_lines_and_no_function_over_50() -> None:
    over = [f"{u.name}: {u.kind} of {u.lines} lines" for u in sizes.over_limits()]
    assert over == [], "split these (python -m devtools.sizes shows the longest)"


def test_the_size_check_sees_a_long_function(tmp_path: Path) -> None:
    package = tmp_path / "undolog"
    package.mkdir()
    body = "\n".join(f"    x{n} = {n}" for n in range(51))
    (package / "long.py").write_text(f'def long():\n    """Docstring lines are not counted."""\n{body}\n')
    assert [(u.name, u.lines) for u in sizes.over_limits(package)] == [("undolog.long:long", 51)]


@pytest.mark.parametrize("model", list(CHANGES), ids=lambda m: m.__name__)
def test_each_typed_change_names_exactly_its_models_fields(model: type[BaseModel]) -> None:
    """A field added to a status model is a key of its change too, or mypy would refuse it."""
    assert set(typing.get_type_hints(CHANGES[model])) == set(model.model_fields)


def test_a_change_is_a_copy_with_the_fields_changed() -> None:
    before = UndoEntryStatus(state=EntryState.RUNNING, retry_count=2)
    after = changed(before, {"state": EntryState.PENDING, "retry_count": 0})
    assert (after.state, after.retry_count, after.effect) == (EntryState.PENDING, 0, before.effect)
    assert before.state == EntryState.RUNNING
