"""Argument templating: ${steps.<name>.output.<path>} references."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from undolog.decisions.arguments import referenced_steps, resolve, within
from undolog.errors import ArgumentsTooLarge, UnresolvedReference

OUTPUTS: dict[str, Any] = {
    "create_user": {"user_id": "u-42", "profile": {"tags": ["a", "b"]}, "quota": 5},
    "in_flight": None,
}


def test_whole_string_reference_keeps_the_json_type() -> None:
    args = {"id": "${steps.create_user.output.user_id}", "quota": "${steps.create_user.output.quota}"}
    assert resolve(args, OUTPUTS) == {"id": "u-42", "quota": 5}


def test_reference_inside_text_and_nested_paths() -> None:
    args = {"note": "user ${steps.create_user.output.user_id} tag ${steps.create_user.output.profile.tags.1}"}
    assert resolve(args, OUTPUTS) == {"note": "user u-42 tag b"}
    assert resolve({"all": ["${steps.create_user.output.profile}"]}, OUTPUTS) == {"all": [{"tags": ["a", "b"]}]}


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("${steps.later.output.x}", "refers to step 'later', which has not run before this call"),
        ("${steps.create_user.output.email}", "the output of step 'create_user' has no 'email'"),
        ("${steps.create_user.output.profile.tags.9}", "has no '9'"),
        ("${env.HOME}", "is not a reference of the form"),
        ("${steps.in_flight.output.id}", "step 'in_flight' returned no output"),
    ],
)
def test_bad_references_name_themselves(expression: str, message: str) -> None:
    with pytest.raises(UnresolvedReference, match=message.replace("(", r"\(").replace(")", r"\)")):
        resolve({"x": expression}, OUTPUTS)


def test_a_compensation_still_runs_when_its_step_never_answered() -> None:
    assert resolve({"id": "${steps.in_flight.output.id}"}, OUTPUTS, missing_as_null=True) == {"id": None}


def test_referenced_steps_are_listed_in_order() -> None:
    args = {"a": "${steps.one.output.x}", "b": ["${steps.two.output}", {"c": "x ${steps.one.output.y}"}]}
    assert referenced_steps(args) == ["one", "two", "one"]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet=st.characters(blacklist_characters="$")),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4),
    max_leaves=20,
)


@given(json_values)
def test_values_without_references_are_unchanged(value: Any) -> None:
    assert resolve(value, OUTPUTS) == value
    assert referenced_steps(value) == []


# Characters JSON writes as they are (no escapes), so that the sizes compare exactly.
plain_text = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126, blacklist_characters='"\\$'))
plain_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | plain_text,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(plain_text, children, max_size=4),
    max_leaves=20,
)


@given(plain_values, st.integers(0, 300))
def test_the_bound_is_the_size_of_the_compact_json(value: Any, limit: int) -> None:
    size = len(json.dumps(value, separators=(",", ":")))
    assert within(value, limit) == (size <= limit)


def test_one_output_named_many_times_is_refused_without_being_written_out() -> None:
    outputs = {"big": {"blob": "x" * 1000}}
    with pytest.raises(ArgumentsTooLarge, match="more than 10000 bytes"):
        resolve({"copies": ["${steps.big.output}"] * 1_000_000}, outputs, limit=10_000)
    with pytest.raises(ArgumentsTooLarge):
        resolve("${steps.big.output.blob}" * 1_000, outputs, limit=10_000)
    assert resolve({"copies": ["${steps.big.output}"] * 9}, outputs, limit=10_000)["copies"][8] == {"blob": "x" * 1000}
