"""Step names the SDK makes: from a tool's function name, and for a tool called again. Whatever
the function is called and however often, the name is one the API takes."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from undolog.api.common import MAX_STEP_NAME, STEP_NAME
from undolog.conventions import repeated_step, step_name_of, step_name_refusal

identifiers = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,120}", fullmatch=True)


@given(identifiers, st.integers(min_value=1, max_value=10**6))
def test_any_function_name_makes_a_step_name_and_so_does_calling_it_again(tool: str, position: int) -> None:
    name = step_name_of(tool)
    assert step_name_refusal(name) is None
    again = repeated_step(name, position)
    assert re.fullmatch(STEP_NAME, again)
    assert len(again) <= MAX_STEP_NAME
    assert again.endswith(f"-{position}")


def test_names_read_as_the_function_was_called() -> None:
    assert step_name_of("create_user") == "create_user"
    assert step_name_of("_CreateUser") == "createuser"
    assert step_name_of("__call__") == "call"
    assert step_name_of("_") == "tool"
    long = "provision_" + "x" * 53  # 63 characters: fine once, and a second call must fit too
    assert step_name_of(long) == long
    assert repeated_step(long, 12) == long[:60] + "-12"
    assert repeated_step("a" * 61 + "_b", 7) == "a" * 61 + "-7"  # no '_' left before the suffix


def test_a_name_that_is_no_step_name_is_refused_saying_the_rule() -> None:
    refusal = step_name_refusal("Create User")
    assert refusal is not None
    assert refusal.startswith("'Create User' is not a step name: lower-case letters, digits")
    assert step_name_refusal("a" * 64) is not None
