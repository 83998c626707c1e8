"""decisions/saga_handles.py: a handle names its saga for one client, and nothing else opens it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from undolog.decisions import saga_handles
from undolog.decisions.saga_handles import HandleRefusal, OpenRound, SagaHandle, mint, opened, opened_round, seal_round

KEY = b"k" * 32
SAGA = SagaHandle("agents", "mcp-x7k2p", "6f1c0e7e-2a4b-4c5d-9e8f-0a1b2c3d4e5f")
HANDLE_TEXT = mint(KEY, SAGA, "alice")


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


OPEN = OpenRound(HANDLE_TEXT, 4, "the server's own state", confirmed=True)


def test_an_open_round_comes_back_whole_and_a_server_s_own_state_is_not_one() -> None:
    sealed = seal_round(KEY, OPEN)
    assert opened_round(KEY, sealed) == OPEN
    assert opened_round(KEY, seal_round(KEY, OpenRound(HANDLE_TEXT, 1, None, confirmed=False))) == OpenRound(
        HANDLE_TEXT, 1, None, False
    )
    assert opened_round(KEY, "the server's own state") is None  # passed through to the server as it is
    assert opened_round(KEY, None) is None


def test_a_round_sealed_under_another_key_or_as_a_handle_is_refused() -> None:
    refused = opened_round(b"another key", seal_round(KEY, OPEN))
    assert isinstance(refused, HandleRefusal)
    assert refused.kind == "forged"
    handle_shaped = "ulr1." + HANDLE_TEXT.split(".", 1)[1]  # a handle's payload and MAC under the round's prefix
    assert isinstance(opened_round(KEY, handle_shaped), HandleRefusal)


@given(st.integers(min_value=0), st.sampled_from("AQgz_-0."))
def test_no_single_character_changed_opens_another_round(index: int, replacement: str) -> None:
    """An agent cannot move a retry to another step nor claim a confirmation it was not given."""
    sealed = seal_round(KEY, OPEN)
    at = index % len(sealed)
    changed = sealed[:at] + replacement + sealed[at + 1 :]
    if changed != sealed:
        assert not isinstance(opened_round(KEY, changed), OpenRound)


def test_a_task_comes_back_whole_for_its_caller_only() -> None:
    task = saga_handles.UpstreamTask("tracker", "task-7", "team-a/s-1", 3)
    sealed = saga_handles.seal_task(KEY, task, "alice")
    assert saga_handles.opened_task(KEY, sealed, "alice") == task
    plain = saga_handles.UpstreamTask("tracker", "task-8")  # a task passed through, no step of a saga
    assert saga_handles.opened_task(KEY, saga_handles.seal_task(KEY, plain, None), None) == plain
    refusals = {
        "foreign": saga_handles.opened_task(KEY, sealed, "mallory"),
        "forged": saga_handles.opened_task(b"another-key", sealed, "alice"),
        "malformed": saga_handles.opened_task(KEY, "task-7", "alice"),
    }
    for kind, refused in refusals.items():
        assert isinstance(refused, saga_handles.HandleRefusal)
        assert refused.kind == kind
