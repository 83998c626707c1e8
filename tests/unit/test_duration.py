"""The age filter shared by `undolog list --older-than` and the dashboard: kubectl's forms, and
whatever a person (or a link) types refused with the text named, never a traceback."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from undolog.inspect import duration

parts = st.integers(min_value=0, max_value=10**6)


@given(st.tuples(parts, parts, parts, parts), st.lists(st.booleans(), min_size=4, max_size=4))
def test_kubectl_forms_read_as_the_sum_of_their_parts(values: tuple[int, int, int, int], shown: list[bool]) -> None:
    if not any(shown):
        shown[3] = True
    text = "".join(f"{v}{unit}" for v, unit, on in zip(values, "dhms", shown, strict=True) if on)
    names = ("days", "hours", "minutes", "seconds")
    expected = timedelta(**{name: v for v, name, on in zip(values, names, shown, strict=True) if on})
    assert duration(text) == expected


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("", "is not a duration such as 90s"),
        ("15", "is not a duration"),
        ("m15", "is not a duration"),
        ("\u0661\u0662m", "is not a duration"),  # Arabic-Indic digits: int() reads them, kubectl does not
        ("1m1h", "is not a duration"),
        ("1000000000d", "is longer than any age (at most 999999999 days)"),
        ("9" * 5000 + "s", "is longer than any age"),  # past Python's 4,300 digits
    ],
)
def test_what_is_not_an_age_is_refused_naming_the_text(text: str, said: str) -> None:
    with pytest.raises(ValueError, match=re.escape(said)) as refused:
        duration(text)
    assert repr(text[:40])[:-1] in str(refused.value)
    assert len(str(refused.value)) < 200
