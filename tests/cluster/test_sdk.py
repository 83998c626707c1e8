"""The agent SDK against the real apiserver with the operator running."""

from __future__ import annotations

import asyncio
import concurrent.futures
import re
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Cluster, own_control_plane
from tests.support.manifests import webhook
from tests.support.operator_process import OperatorProcess
from tests.support.participants import Participant
from tests.support.waiting import eventually, saga_phase
from undolog.errors import AlreadyExists, Unavailable
from undolog.kube import Kube
from undolog.sdk import Call, NotSent, SagaEnded, current_step, open_saga, undoable
from undolog.sdk import sync as sync_sdk

pytestmark = pytest.mark.cluster


class ToolFailed(RuntimeError):
    pass


async def register(kube: Kube, namespace: str, participant: Participant, *functions: str) -> None:
    for function in functions:
        await kube.create("webhooks", namespace, webhook(function, url=participant.url(f"/{function}")))


async def entries(kube: Kube, namespace: str, saga: str) -> list[dict[str, Any]]:
    listed = await kube.list("undoentries", namespace, field_selector=f"spec.saga={saga}")
    return sorted(listed, key=lambda e: e["spec"]["stackPosition"])


async def test_a_tool_that_raises_aborts_and_is_undone_newest_first(
    kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess, cluster: Cluster
) -> None:
    await register(kube, namespace, participant, "delete-user", "revoke", "recall")
    seen_keys: list[str] = []

    @undoable(lambda email: Call(function="delete-user", args={"email": email}))
    async def create_user(email: str) -> dict[str, Any]:
        seen_keys.append(current_step().forward_key)
        return {"user_id": "u-1"}

    @undoable(lambda user: Call(function="revoke", args={"user": user}))
    async def grant(user: str) -> None:
        return None

    @undoable(lambda to: Call(function="recall", args={"to": to}))
    async def send_email(to: str) -> None:
        raise ToolFailed("mail server said no")

    saga = await open_saga(generate_name="agent-", namespace=namespace, kubeconfig=str(cluster.kubeconfig))

    async def agent() -> None:
        async with saga:
            user = await create_user("ada@example.com")
            await grant(user["user_id"])
            await send_email("ada@example.com")

    with pytest.raises(ToolFailed):
        await agent()
    done = await saga_phase(kube, namespace, saga.name, "Compensated")
    assert [r.path for r in participant.received()] == ["/recall", "/revoke", "/delete-user"]
    assert participant.received("/delete-user")[0].body == {"email": "ada@example.com"}
    assert participant.received("/delete-user")[0].headers["undolog-forward-key"] == seen_keys[0]
    assert done["status"]["failedStep"] == "send_email"
    assert "ToolFailed: mail server said no" in done["status"]["conditions"][0]["message"]
    listed = await entries(kube, namespace, saga.name)
    assert [e["status"]["effect"] for e in listed] == ["Committed", "Committed", "Failed"]
    assert listed[0]["status"]["output"] == {"user_id": "u-1"}
    for entry in listed:
        assert entry["spec"]["registeredAt"] < entry["status"]["executedAt"]


async def test_a_tool_that_never_sent_its_call_is_not_undone(
    kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess, cluster: Cluster
) -> None:
    await register(kube, namespace, participant, "delete-user", "refund")

    @undoable(lambda email: Call(function="delete-user", args={"email": email}))
    async def create_user(email: str) -> None:
        return None

    @undoable(lambda amount: Call(function="refund", args={"amount": amount}))
    async def charge(amount: int) -> None:
        raise NotSent(f"amount {amount} is over the card's limit: refused before calling the bank")

    saga = await open_saga(generate_name="agent-", namespace=namespace, kubeconfig=str(cluster.kubeconfig))

    async def agent() -> None:
        async with saga:
            await create_user("ada@example.com")
            await charge(10**9)

    with pytest.raises(NotSent):
        await agent()
    await saga_phase(kube, namespace, saga.name, "Compensated")
    assert [r.path for r in participant.received()] == ["/delete-user"]  # no refund of a charge never made
    never = (await entries(kube, namespace, saga.name))[1]["status"]
    assert (never["effect"], never["state"], never["reason"]) == ("NotSent", "Skipped", "NotSent")
    assert "over the card's limit" in never["skipReason"]


async def test_steps_declare_what_they_depend_on_and_unknown_names_are_refused(
    kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess, cluster: Cluster
) -> None:
    await register(kube, namespace, participant, "delete-user", "revoke", "recall")
    saga = await open_saga(generate_name="agent-", namespace=namespace, kubeconfig=str(cluster.kubeconfig))

    async def agent() -> None:
        async with saga:
            async with saga.step("create_user", Call(function="delete-user")):
                pass
            with pytest.raises(ValueError, match="depends_on send_mail, which no step of saga"):
                await saga.register("grant", Call(function="revoke"), depends_on=["send_mail"])
            async with saga.step("grant", Call(function="revoke"), depends_on=["create_user"]):
                pass
            async with saga.step("send_email", Call(function="recall"), depends_on=["create_user"]):
                pass
            raise ToolFailed("changed my mind")

    with pytest.raises(ToolFailed):
        await agent()
    await saga_phase(kube, namespace, saga.name, "Compensated")
    listed = await entries(kube, namespace, saga.name)
    assert [e["spec"].get("dependsOn") for e in listed] == [None, ["create_user"], ["create_user"]]
    paths = [r.path for r in participant.received()]
    assert sorted(paths[:2]) == ["/recall", "/revoke"]  # together, in either order
    assert paths[2:] == ["/delete-user"]


async def test_concurrent_tools_get_distinct_increasing_positions(
    kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess, cluster: Cluster
) -> None:
    await register(kube, namespace, participant, "undo")

    @undoable(lambda n: Call(function="undo", args={"n": n}))
    async def tool(n: int) -> dict[str, int]:
        await asyncio.sleep(0.01 * (n % 3))
        return {"n": n}

    async with await open_saga(generate_name="many-", namespace=namespace, kubeconfig=str(cluster.kubeconfig)) as saga:
        results = await asyncio.gather(*(tool(n) for n in range(12)))
    assert [r["n"] for r in results] == list(range(12))
    done = await saga_phase(kube, namespace, saga.name, "Completed")
    listed = await entries(kube, namespace, saga.name)
    assert [e["spec"]["stackPosition"] for e in listed] == list(range(1, 13))
    assert len({e["spec"]["step"] for e in listed}) == 12  # one tool, twelve steps, twelve keys
    assert len({e["spec"]["effectId"] for e in listed}) == 12
    assert done["status"]["stackDepth"] == 12
    for entry in listed:
        assert entry["spec"]["registeredAt"] < entry["status"]["executedAt"]
    assert participant.received() == []


def test_sync_facade_from_threads(
    kube: Kube,
    namespace: str,
    participant: Participant,
    operator: OperatorProcess,
    cluster: Cluster,
    session_loop: asyncio.AbstractEventLoop,
) -> None:
    session_loop.run_until_complete(register(kube, namespace, participant, "undo", "mail"))

    @sync_sdk.undoable(lambda n: Call(function="undo", args={"n": n}))
    def tool(n: int) -> dict[str, int]:
        return {"n": n}

    with sync_sdk.open_saga(generate_name="sync-", namespace=namespace, kubeconfig=str(cluster.kubeconfig)) as saga:
        name = saga.name
        with saga.step("first", compensation=Call(function="undo")) as step:
            step.output = {"ok": True}
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda n: _in_saga(saga, tool, n), range(6)))
        saga.stage_effect("thanks", Call(function="mail", args={"to": "ada"}))
    session_loop.run_until_complete(
        eventually(
            lambda: kube.get("sagas", namespace, name),
            lambda s: (s.get("status", {}).get("effects") or [{}])[0].get("state") == "Delivered",
            30,
            "completed with its effect delivered",
        )
    )
    listed = session_loop.run_until_complete(entries(kube, namespace, name))
    assert [e["spec"]["stackPosition"] for e in listed] == list(range(1, 8))
    assert [r.path for r in participant.received()] == ["/mail"]


def _in_saga(saga: sync_sdk.Saga, tool: Any, n: int) -> Any:
    # A worker thread has its own context: enter the saga there, as an agent's tool thread would.
    with saga.step(f"worker-{n}", compensation=Call(function="undo", args={"n": n})):
        return tool.__wrapped__(n)


async def test_a_step_after_the_end_is_refused_and_not_registered(
    kube: Kube, namespace: str, operator: OperatorProcess, cluster: Cluster, tmp_path: Path
) -> None:
    saga = await open_saga(name="ended", namespace=namespace, kubeconfig=str(cluster.kubeconfig))
    await saga.abort("changed my mind")
    with pytest.raises(SagaEnded, match="is Abort"):
        async with saga.step("late", compensation=Call(function="undo")):
            pytest.fail("the step body must not run")
    await saga.close()
    done = await saga_phase(kube, namespace, "ended", "Compensated")
    assert done["status"]["stackDepth"] == 0
    assert (
        "changed my mind" in done["status"]["message"]
        or "changed my mind" in done["status"]["conditions"][0]["message"]
    )
    assert await entries(kube, namespace, "ended") == []


async def test_wait_after_the_block_and_the_kubeconfigs_namespace(
    kube: Kube, namespace: str, operator: OperatorProcess, cluster: Cluster, tmp_path: Path
) -> None:
    """Used as documented: no namespace given (the context's is used), `wait()` after the block
    (which closed the SDK's own client) returns the final saga."""
    import yaml

    config = yaml.safe_load(cluster.kubeconfig.read_text())
    config["contexts"][0]["context"]["namespace"] = namespace
    scoped = tmp_path / "scoped.kubeconfig"
    scoped.write_text(yaml.safe_dump(config))
    saga = await open_saga(generate_name="doc-", kubeconfig=str(scoped))
    async with saga:
        pass
    done = await saga.wait(within=30)
    assert saga.namespace == namespace
    assert done.status.phase == "Completed"


@pytest.mark.fault  # an apiserver outage of its own (31 s): make chaos and CI, not make test
async def test_a_saga_whose_agent_fails_during_an_apiserver_outage_is_still_undone(tmp_path: Path) -> None:
    """The apiserver restarts (an upgrade) while an agent is mid-saga: its next step cannot be
    registered, so the block aborts. The abort was written once, failed at once, and the saga
    stayed Active with its first step's effect in place: nothing undoes an Active saga. Now the
    SDK writes it again until the API is back."""
    async with own_control_plane(tmp_path) as own:
        kube, namespace = own.kube, own.namespace
        await register(kube, namespace, own.participant, "delete-user")
        operator = OperatorProcess(own.kubeconfig, namespace, tmp_path / "operator", extra_args=())
        operator.start()
        try:
            saga = await open_saga(name="mid-upgrade", namespace=namespace, kubeconfig=str(own.kubeconfig))
            outage: asyncio.Future[float] | None = None

            async def api_down() -> bool:
                try:
                    await kube.get("sagas", namespace, "mid-upgrade")
                except Unavailable:
                    return True
                return False

            async def agent() -> None:
                nonlocal outage
                async with saga:
                    async with saga.step("create_user", Call(function="delete-user", args={"id": "u-1"})) as made:
                        made.output = {"id": "u-1"}
                    outage = asyncio.ensure_future(asyncio.to_thread(own.local.restart, "kube-apiserver", 8.0))
                    await eventually(api_down, bool, 10, "the apiserver down")
                    async with saga.step("grant", Call(function="delete-user", args={"id": "g-1"})):
                        pass  # never reached: the step cannot be registered

            with pytest.raises(Unavailable):  # refused, or answered 503 by an apiserver shutting down
                await agent()
            assert outage is not None
            print(f"\napiserver back after {await outage:.1f} s")
            # The agent then waits for the undo, and the apiserver restarts again meanwhile: a wait
            # is a wait (wait() raised Unavailable at the first read that failed).
            second = asyncio.ensure_future(asyncio.to_thread(own.local.restart, "kube-apiserver", 3.0))
            await eventually(api_down, bool, 10, "the apiserver down again")
            done = await saga.wait(within=60)
            assert done.status.phase == "Compensated"
            await second
        finally:
            operator.stop()
    undone = own.participant.received("/delete-user")
    assert {r.body["id"] for r in undone} == {"u-1"}  # the first step, and only it
    assert len({r.key for r in undone}) == 1  # sent again only under its key (an outcome lost to the restart)


async def test_tools_of_any_name_called_again_and_again_are_registered(
    kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess, cluster: Cluster
) -> None:
    """A tool named in 63 characters worked once and failed on its second call (its step name
    with "-2" appended was too long for the API); one called `_CreateUser` failed at once with
    pydantic's pattern error. A step name given outright that is none is refused, naming the
    rule, before anything is written."""
    await register(kube, namespace, participant, "undo")

    @undoable(lambda n: Call(function="undo", args={"n": n}))
    async def provision_the_tenant_database_with_default_settings_and_admins2(n: int) -> None:
        return None

    @undoable(lambda n: Call(function="undo", args={"n": n}))
    async def _CreateUser(n: int) -> None:  # a name as agents write them
        return None

    long = provision_the_tenant_database_with_default_settings_and_admins2.__name__
    assert len(long) == 63
    saga = await open_saga(generate_name="names-", namespace=namespace, kubeconfig=str(cluster.kubeconfig))
    async with saga:
        for n in (1, 2, 3):
            await provision_the_tenant_database_with_default_settings_and_admins2(n)
        await _CreateUser(4)
        await _CreateUser(5)
        with pytest.raises(ValueError, match="'Create User' is not a step name: lower-case letters"):
            async with saga.step("Create User"):
                pass
    await saga_phase(kube, namespace, saga.name, "Completed")
    listed = await entries(kube, namespace, saga.name)
    assert [e["spec"]["step"] for e in listed] == [
        long,
        f"{long[:61]}-2",
        f"{long[:61]}-3",
        "createuser",
        "createuser-5",
    ]
    assert [e["spec"]["stackPosition"] for e in listed] == [1, 2, 3, 4, 5]


async def test_an_agent_restarted_after_a_crash_resumes_its_saga_and_can_undo_it(
    kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess, cluster: Cluster
) -> None:
    """An agent killed inside its block leaves its saga Active with what its steps did. Run
    again, it opened the same saga name and got AlreadyExists: it could neither go on nor
    abort, and the effects stayed. Now it resumes the saga: new steps come after the old ones,
    and an abort undoes all of them, newest first."""
    await register(kube, namespace, participant, "undo")
    config = str(cluster.kubeconfig)
    first = await open_saga(name="job-7", namespace=namespace, kubeconfig=config)
    for n in (1, 2):
        async with first.step("provision", Call(function="undo", args={"n": n})):
            pass
    await first.close()  # killed here: never left its block

    with pytest.raises(AlreadyExists, match=re.escape("open_saga(..., resume=True) carries on with it")):
        await open_saga(name="job-7", namespace=namespace, kubeconfig=config)
    again = await open_saga(name="job-7", namespace=namespace, kubeconfig=config, resume=True)

    async def second_run() -> None:
        async with again:
            async with again.step("provision", Call(function="undo", args={"n": 3})):
                pass
            raise ToolFailed("the second run failed too")

    with pytest.raises(ToolFailed):
        await second_run()
    await saga_phase(kube, namespace, "job-7", "Compensated")
    assert [r.body["n"] for r in participant.received("/undo")] == [3, 2, 1]
    listed = await entries(kube, namespace, "job-7")
    assert [(e["spec"]["stackPosition"], e["spec"]["step"]) for e in listed] == [
        (1, "provision"),
        (2, "provision-2"),
        (3, "provision-3"),
    ]
    with pytest.raises(SagaEnded, match=re.escape("is Compensated (outcome Abort): it cannot be resumed")):
        await open_saga(name="job-7", namespace=namespace, kubeconfig=config, resume=True)
