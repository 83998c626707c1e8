"""decisions/saga_handles.py: a handle names its saga for one client, and nothing else opens it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from undolog.decisions.saga_handles import HandleRefusal, SagaHandle, mint, opened

KEY = b"k" * 32
SAGA = SagaHandle("agents", "mcp-x7k2p", "6f1c0e7e-2a4b-4c5d-9e8f-0a1b2c3d4e5f")


def test_a_handle_opens_its_saga_for_the_client_it_was_minted_for() -> None:
    assert opened(KEY, mint(KEY, SAGA, "alice"), "alice", "agents") == SAGA
    assert opened(KEY, mint(KEY, SAGA, None), None, "agents") == SAGA


def test_another_key_another_identity_another_namespace_and_junk_are_refused_saying_which() -> None:
    handle = mint(KEY, SAGA, "alice")
    refusals = {
        "forged": opened(b"other" * 8, handle, "alice", "agents"),
        "foreign identity": opened(KEY, handle, "mallory", "agents"),
        "foreign namespace": opened(KEY, handle, "alice", "billing"),
        "malformed": opened(KEY, "mcp-x7k2p", "alice", "agents"),
    }
    assert {why: r.kind for why, r in refusals.items() if isinstance(r, HandleRefusal)} == {
        "forged": "forged",
        "foreign identity": "foreign",
        "foreign namespace": "foreign",
        "malformed": "malformed",
    }


@given(st.integers(min_value=0, max_value=200), st.characters(codec="ascii", exclude_characters="."))
def test_no_single_character_changed_opens_a_handle(index: int, replacement: str) -> None:
    handle = mint(KEY, SAGA, "alice")
    position = index % len(handle)
    changed = handle[:position] + replacement + handle[position + 1 :]
    if changed != handle:
        assert isinstance(opened(KEY, changed, "alice", "agents"), HandleRefusal)
