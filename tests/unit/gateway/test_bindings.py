"""Which saga a request belongs to (gateway/sessions.py, gateway/handles.py) and the per-caller
limits on opening one (gateway/caller_limits.py), on the fake API: each caller's sagas in its
namespace, with its name; a handle refused to anyone else."""

from __future__ import annotations

from typing import Any, cast

import mcp_types as types
import pytest

from tests.support.fakes import FakeKube
from tests.support.gateway_settings import settings
from undolog.api.gateway import CallerLimits
from undolog.errors import SagaEnded
from undolog.gateway.caller_limits import LimitReached, Limits
from undolog.gateway.handles import HandleRefused, HandleSagas, binding
from undolog.gateway.sessions import SessionBinding, SessionSaga, no_limit
from undolog.gateway.steps import NotCalled
from undolog.gateway.upstreams import Answer, Rounds
from undolog.kube import Kube
from undolog.sdk import SagaRun

CONFIG = settings()
ALICE, BOB = "https://login.example/#alice", "system:serviceaccount:team-b:agent"


def handles(kube: FakeKube, limits: Limits | None = None) -> HandleSagas:
    opening = limits.opening if limits is not None else no_limit
    return HandleSagas(CONFIG, cast(Kube, kube), b"the-unit-tests-handle-key", opening)


def stateless(sagas: HandleSagas, who: str, namespace: str, arguments: dict[str, Any]) -> Any:
    return binding(sagas, (who, namespace), "tracker.create_issue", arguments, None, None)


async def test_a_handle_opens_the_caller_s_saga_in_its_namespace_and_is_refused_to_anyone_else() -> None:
    kube = FakeKube()
    sagas = handles(kube)
    opened = await stateless(sagas, ALICE, "team-a", {}).opened()
    [saga] = await kube.list("sagas", "team-a")
    assert saga["spec"]["principal"] == ALICE
    handle = sagas.handle_of(opened, ALICE)
    arguments = {"undolog_saga": handle, "title": "x"}
    again = stateless(sagas, ALICE, "team-a", arguments)
    assert "undolog_saga" not in arguments  # taken out: it never goes upstream
    assert (await again.named("undolog_status")).uid == opened.uid
    with pytest.raises(HandleRefused, match="minted for another client identity"):
        await stateless(sagas, BOB, "team-a", {"undolog_saga": handle}).named("undolog_abort")
    with pytest.raises(HandleRefused, match=r"of namespace team-a, not the caller's \(team-b\)"):
        await stateless(sagas, ALICE, "team-b", {"undolog_saga": handle}).named("undolog_abort")
    with pytest.raises(HandleRefused, match="undolog_commit needs undolog_saga"):
        await stateless(sagas, ALICE, "team-a", {}).named("undolog_commit")


async def test_a_session_keeps_one_saga_until_it_ends_then_opens_another() -> None:
    kube = FakeKube()
    session = SessionSaga(CONFIG, cast(Kube, kube), "team-b", BOB)
    bound = SessionBinding(session)
    assert await bound.named("undolog_status") is None
    first = await bound.opened()
    assert (await bound.opened()).uid == first.uid
    bound.ended(first)
    second = await bound.opened()
    assert second.uid != first.uid
    listed = await kube.list("sagas", "team-b")
    assert [s["spec"]["principal"] for s in listed] == [BOB, BOB]


async def test_a_caller_with_its_open_sagas_at_the_limit_opens_no_other_until_one_ends() -> None:
    kube = FakeKube()
    limits = Limits(CallerLimits(open_sagas=1), cast(Kube, kube))
    sagas = handles(kube, limits)
    opened = await stateless(sagas, ALICE, "team-a", {}).opened()
    with pytest.raises(LimitReached, match=r"has 1 sagas open in team-a \(limits.openSagas 1\)"):
        await stateless(sagas, ALICE, "team-a", {}).opened()
    await stateless(sagas, BOB, "team-a", {}).opened()  # another caller's count is its own
    await opened.commit()
    await stateless(sagas, ALICE, "team-a", {}).opened()


def test_calls_past_the_rate_are_refused_per_caller() -> None:
    limits = Limits(CallerLimits(calls_per_second=0.001, burst=2), cast(Kube, FakeKube()))
    limits.called(ALICE)
    limits.called(ALICE)
    with pytest.raises(LimitReached, match=r"past its 0.001 calls a second \(limits.callsPerSecond, burst 2\)"):
        limits.called(ALICE)
    limits.called(BOB)


def test_rounds_of_a_stateless_request_pass_the_server_s_state_on() -> None:
    sagas = handles(FakeKube())
    bound = binding(sagas, (ALICE, "team-a"), "t.x", {}, "the-server-s-own-state", None)
    assert bound.rounds == Rounds(None, "the-server-s-own-state")


async def test_a_handle_s_step_in_a_saga_ended_elsewhere_is_refused_and_the_next_reads_first() -> None:
    """A step through a handle whose last position this replica knows reads its saga only while
    registering; when another replica or a person ended the saga, the step is recorded NotSent
    and refused, and the next call reads the saga before writing anything."""
    kube = FakeKube()
    sagas = handles(kube)
    opened = await stateless(sagas, ALICE, "team-a", {}).opened()
    sagas.remember(opened)  # as after a step through this replica
    await opened.commit()  # elsewhere
    handle = sagas.handle_of(opened, ALICE)
    ran: list[int] = []

    async def step(run: SagaRun, position: int, meta: dict[str, Any], carried: bool) -> Answer:
        try:
            await run.register(f"create_issue-{position}", None)
        except SagaEnded as ended:
            raise NotCalled(f"tool create_issue was not called: {ended}") from ended
        ran.append(position)
        return types.CallToolResult(content=[])

    with pytest.raises(NotCalled, match=r"is Active \(outcome Commit\).*call without it to start a new saga"):
        await stateless(sagas, ALICE, "team-a", {"undolog_saga": handle}).step("create_issue", step)
    [entry] = await kube.list("undoentries", "team-a")
    assert entry["status"]["effect"] == "NotSent"
    with pytest.raises(NotCalled, match="it cannot be resumed; call without it to start a new saga"):
        await stateless(sagas, ALICE, "team-a", {"undolog_saga": handle}).step("create_issue", step)
    assert len(await kube.list("undoentries", "team-a")) == 1  # refused before any write
    assert ran == []
