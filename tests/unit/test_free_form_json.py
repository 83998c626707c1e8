"""The free-form JSON fields (a call's args, an entry's output), which no CRD schema bounds.

Nesting: the API stores them nested up to 10,000 levels, and Python's json stops near 1,000:
one such entry in a LIST made every listing of its namespace fail, so the operator took charge
of no saga there. Now the answer is parsed whatever its depth, and the object that nests too
deep is refused on its own, by name; the others in the same answer are read as usual.

Numbers: an output is kept only if JSON can carry it back to the API."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from tests.support.objects import entry_body
from undolog import errors
from undolog.api import MAX_NESTING, Call, OutputOmission, Saga, UndoEntry
from undolog.api.common import shape
from undolog.conventions import kept_output
from undolog.kube.decoding import DEEPEST, decoded
from undolog.ledger import Unreadable, parse_entry

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=30,
)


def depth(value: Any) -> int:
    """The reference: levels of objects and arrays, counted by recursion."""
    if isinstance(value, dict):
        return 1 + max(map(depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(depth, value), default=0)
    return 0


def nested(levels: int) -> str:
    """A JSON object `levels` levels deep, as text (json.dumps itself stops near 1,000)."""
    return '{"a":' * levels + "1" + "}" * levels


def with_args(body: dict[str, Any], args: str) -> str:
    """`body` as JSON text whose compensation's args are `args`, JSON text."""
    body["spec"]["compensation"]["args"] = "ARGS"
    return json.dumps(body).replace('"ARGS"', args)


@given(JSON)
def test_nesting_counts_the_levels_of_objects_and_arrays(value: Any) -> None:
    assert shape(value)[0] == depth(value)


def test_a_listing_with_an_entry_nested_as_deep_as_the_api_stores_is_read_but_that_entry() -> None:
    deep = with_args(entry_body("deep", 1), nested(10_000 - 4))  # under the entry, its spec and compensation
    fine = json.dumps(entry_body("fine", 1))
    page = decoded(f'{{"kind":"UndoEntryList","items":[{fine},{deep}]}}'.encode())
    parsed = [parse_entry(item) for item in page["items"]]
    assert isinstance(parsed[0], UndoEntry)
    assert isinstance(parsed[1], Unreadable)
    assert parsed[1].lost.name == "deep-1"
    assert parsed[1].lost.why.startswith("unreadable: spec.compensation.args: ")
    assert f"nests 9996 levels of objects and arrays; UndoLog reads at most {MAX_NESTING}" in parsed[1].lost.why
    # the watch's lines too, one event each
    event = decoded(f'{{"type":"ADDED","object":{deep}}}')
    assert isinstance(parse_entry(event["object"]), Unreadable)


def test_json_deeper_than_the_api_stores_is_an_answer_that_cannot_be_used() -> None:
    with pytest.raises(errors.Unavailable, match=f"nested deeper than {DEEPEST} levels"):
        decoded(nested(2 * DEEPEST))
    assert decoded(b"not json") is None


@pytest.mark.parametrize(("levels", "readable"), [(MAX_NESTING, True), (MAX_NESTING + 1, False)])
def test_args_are_read_up_to_the_bound(levels: int, readable: bool) -> None:
    body = json.loads(with_args(entry_body("s", 1), nested(levels)))
    assert shape(body["spec"]["compensation"]["args"])[0] == levels
    assert isinstance(parse_entry(body), UndoEntry) is readable


def test_a_saga_whose_step_args_nest_too_deep_is_refused_by_name() -> None:
    args = json.loads(nested(MAX_NESTING + 1))
    step = {"name": "s", "action": {"function": "s-do", "args": args}}
    body = {"metadata": {"name": "deep", "namespace": "ns"}, "spec": {"steps": [step]}}
    with pytest.raises(ValidationError) as refused:
        Saga.model_validate(body)
    first = refused.value.errors()[0]
    assert first["loc"] == ("spec", "steps", 0, "action", "args")
    assert f"UndoLog reads at most {MAX_NESTING}" in first["msg"]


def test_an_output_nested_too_deep_is_not_kept_and_says_why() -> None:
    shallow = json.loads(nested(MAX_NESTING))
    assert kept_output(shallow) == (shallow, None)
    output, omitted = kept_output({"deep": json.loads(nested(300))})
    assert output is None
    assert omitted is not None
    assert omitted.reason == OutputOmission.OUTPUT_TOO_DEEP
    assert (
        omitted.message
        == f"the answer was a JSON object nested 301 levels deep; the ledger keeps at most {MAX_NESTING}"
    )


def test_the_sdk_refuses_args_nested_too_deep_before_anything_is_written() -> None:
    with pytest.raises(ValidationError, match=f"nests {MAX_NESTING + 1} levels"):
        Call(function="delete-user", args=json.loads(nested(MAX_NESTING + 1)))


def test_an_output_holding_a_number_json_cannot_carry_is_not_kept() -> None:
    """An SDK step's result with an infinity: stored, pydantic writes it as null, which the
    merge patch takes as "delete the key" (the output would lose it without a word)."""
    output, omitted = kept_output({"id": "u-1", "amount": float("inf")})
    assert output is None
    assert omitted is not None
    assert omitted.reason == OutputOmission.ANSWER_NOT_JSON
    assert "a number JSON cannot carry" in omitted.message


def test_an_integer_the_api_would_round_is_refused_in_args_and_not_kept_in_an_output() -> None:
    """The API stores an integer beyond 64 bits as a float64 (123456789012345678901234567890
    came back 1.2345678901234568e+29): an id sent rounded to a compensation names something else."""
    with pytest.raises(ValidationError, match="holds 123456789012345678901234567890, an integer beyond 64 bits"):
        Call(function="refund", args={"charges": [{"id": 123456789012345678901234567890}]})
    assert Call(function="refund", args={"id": 2**63 - 1, "low": -(2**63), "ok": True}).args["id"] == 2**63 - 1
    output, omitted = kept_output({"id": -(2**63) - 1})
    assert output is None
    assert omitted is not None
    assert omitted.reason == OutputOmission.ANSWER_NOT_JSON
    assert omitted.message == "the answer holds -9223372036854775809, an integer beyond 64 bits the API stores rounded"
    assert kept_output({"id": 10**5000})[1] is not None  # past Python's own 4,300 digits too


@given(JSON)
def test_wide_integers_are_found_wherever_they_are(value: Any) -> None:
    def widest(v: Any) -> list[int]:
        if isinstance(v, dict):
            return [w for child in v.values() for w in widest(child)]
        if isinstance(v, list):
            return [w for child in v for w in widest(child)]
        return [v] if isinstance(v, int) and not -(2**63) <= v < 2**63 else []

    assert (shape(value)[1] is None) == (widest(value) == [])


ANY_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()  # past 64 bits too
    | st.floats(allow_nan=False)  # infinities too: Python's json writes and reads them
    | st.text(max_size=5),  # lone surrogates too (escaped)
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=20,
)


@given(ANY_JSON)
def test_an_answer_reads_as_python_s_json_reads_it(value: Any) -> None:
    """orjson parses the API's answers; what it refuses goes to Python's json, so the values are
    Python's json's whatever the text holds."""
    for text in (json.dumps(value), json.dumps(value, ensure_ascii=False)):
        assert decoded(text) == json.loads(text)
    assert decoded(json.dumps(value).encode()) == json.loads(json.dumps(value))
