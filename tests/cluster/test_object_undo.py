"""Kubernetes objects undone natively: the operator reads the object again and puts back only
what the step changed, only where nothing changed it since, acting as the user the entry names.
Real Deployments, ConfigMaps and Secrets on the tests' control plane; the operator as a process."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.test_entry_owner_policy import refusal
from tests.conftest import REPO, Cluster
from tests.support.identities import create_service_account, service_account_kubeconfig
from tests.support.manifests import saga as saga_manifest
from tests.support.manifests import webhook
from tests.support.operator_process import OperatorProcess
from tests.support.participants import Participant, Received, Reply
from tests.support.waiting import eventually, saga_phase
from undolog import errors
from undolog.api import ActAs, ObjectUndo, Saga
from undolog.cli.triage import conflicts
from undolog.conventions import creation_body, new_undo_entry
from undolog.decisions import object_undo
from undolog.inspect import Inspector
from undolog.kube import Kube
from undolog.kube.objects import Discovery, Objects
from undolog.sdk import SagaRun, open_saga
from undolog.sdk.objects import changing

pytestmark = pytest.mark.cluster
MERGE = "application/merge-patch+json"


def deployment(name: str, replicas: int) -> dict[str, Any]:
    labels = {"app": name}
    container = {"name": "web", "image": "registry.invalid/web:1"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [container]}},
        },
    }


def config_map(name: str, **data: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "labels": {"tier": "gold"}},
        "data": data,
    }


def apps(namespace: str, name: str = "") -> str:
    return f"/apis/apps/v1/namespaces/{namespace}/deployments" + (f"/{name}" if name else "")


def core(namespace: str, plural: str, name: str = "") -> str:
    return f"/api/v1/namespaces/{namespace}/{plural}" + (f"/{name}" if name else "")


async def agent(cluster: Cluster, namespace: str) -> SagaRun:
    return await open_saga(generate_name="agent-", namespace=namespace, kubeconfig=str(cluster.kubeconfig))


async def aborted(saga: SagaRun) -> str:
    await saga.abort("the agent gave up")
    await saga.close()
    return saga.name


async def test_a_scale_changed_again_since_halts_as_conflict_and_a_change_elsewhere_is_kept(
    kube: Kube, namespace: str, cluster: Cluster, operator: OperatorProcess
) -> None:
    await kube.request("POST", apps(namespace), deployment("web", 2))
    await kube.request("POST", apps(namespace), deployment("api", 2))
    # web: scaled 2 → 5 by the agent, then 5 → 10 by a second writer: the 10 is kept.
    saga = await agent(cluster, namespace)
    async with changing(saga, "scale-web", "deployment", "web"):
        await kube.request("PATCH", apps(namespace, "web"), {"spec": {"replicas": 5}}, content_type=MERGE)
    await kube.request("PATCH", apps(namespace, "web"), {"spec": {"replicas": 10}}, content_type=MERGE)
    halted = await saga_phase(kube, namespace, await aborted(saga), "Halted")
    assert halted["status"]["reason"] == "Conflict"
    assert (await kube.request("GET", apps(namespace, "web")))["spec"]["replicas"] == 10
    entry = await kube.get("undoentries", namespace, f"{halted['metadata']['name']}-1")
    assert (entry["status"]["state"], entry["status"]["reason"]) == ("Failed", "Conflict")
    guard = entry["status"]["guard"]
    assert guard["differing"] == ["spec.replicas"]
    assert (entry["spec"]["kubernetes"]["before"]["spec"]["replicas"], guard["after"]["spec"]["replicas"]) == (2, 5)
    assert guard["now"]["spec"]["replicas"] == 10
    assert "undolog undo-anyway" in entry["status"]["lastError"]
    shown = conflicts((await Inspector(kube).show(namespace, halted["metadata"]["name"])).entries)
    assert "  spec.replicas: before 2, after 5, now 10" in shown

    # api: scaled 2 → 5 by the agent, then relabelled by a second writer: scaled back, label kept.
    saga = await agent(cluster, namespace)
    async with changing(saga, "scale-api", "deployments.apps", "api"):
        await kube.request("PATCH", apps(namespace, "api"), {"spec": {"replicas": 5}}, content_type=MERGE)
    later = {"metadata": {"labels": {"owner": "someone-else"}}}
    await kube.request("PATCH", apps(namespace, "api"), later, content_type=MERGE)
    await saga_phase(kube, namespace, await aborted(saga), "Compensated")
    api = await kube.request("GET", apps(namespace, "api"))
    assert api["spec"]["replicas"] == 2
    assert api["metadata"]["labels"] == {"app": "api", "owner": "someone-else"}


async def test_a_config_map_s_data_patched_deleted_or_created_and_a_created_deployment_are_undone(
    kube: Kube, namespace: str, cluster: Cluster, operator: OperatorProcess
) -> None:
    await kube.request("POST", core(namespace, "configmaps"), config_map("settings", mode="safe", size="s"))
    await kube.request("POST", core(namespace, "configmaps"), config_map("gone", keep="me"))
    saga = await agent(cluster, namespace)
    async with changing(saga, "patch-settings", "cm", "settings"):
        patch = {"data": {"mode": "fast"}, "metadata": {"labels": {"tier": "silver"}}}
        await kube.request("PATCH", core(namespace, "configmaps", "settings"), patch, content_type=MERGE)
    async with changing(saga, "delete-gone", "configmap", "gone"):
        await kube.request("DELETE", core(namespace, "configmaps", "gone"))
    async with changing(saga, "create-fresh", "configmaps", "fresh"):
        await kube.request("POST", core(namespace, "configmaps"), config_map("fresh", new="yes"))
    async with changing(saga, "create-worker", "deployment", "worker"):
        await kube.request("POST", apps(namespace), deployment("worker", 1))
    # A second writer changes another key of settings: kept.
    later = {"data": {"size": "xl"}}
    await kube.request("PATCH", core(namespace, "configmaps", "settings"), later, content_type=MERGE)
    await saga_phase(kube, namespace, await aborted(saga), "Compensated")
    settings = await kube.request("GET", core(namespace, "configmaps", "settings"))
    assert (settings["data"], settings["metadata"]["labels"]) == ({"mode": "safe", "size": "xl"}, {"tier": "gold"})
    gone = await kube.request("GET", core(namespace, "configmaps", "gone"))
    assert (gone["data"], gone["metadata"]["labels"]) == ({"keep": "me"}, {"tier": "gold"})
    with pytest.raises(errors.NotFound):
        await kube.request("GET", core(namespace, "configmaps", "fresh"))
    with pytest.raises(errors.NotFound):  # a created Deployment gone (its status moved on meanwhile: no conflict)
        await kube.request("GET", apps(namespace, "worker"))


async def granted(kube: Kube, namespace: str, account: str, rules: list[dict[str, Any]]) -> None:
    """A ServiceAccount with a Role of `rules` bound to it."""
    await create_service_account(kube, namespace, account)
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}"
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": account}, "rules": rules}
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": account},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": account},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
    }
    await kube.request("POST", f"{rbac}/roles", role)
    await kube.request("POST", f"{rbac}/rolebindings", binding)


async def test_the_undo_acts_as_the_user_its_entry_names_and_a_missing_right_is_named(
    kube: Kube, namespace: str, cluster: Cluster, operator: OperatorProcess
) -> None:
    """The entry acts as a ServiceAccount that may read ConfigMaps but not patch them: the API
    refuses the undo, which halts naming the user and the right; the object is left as it is."""
    await granted(kube, namespace, "reader", [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}])
    await kube.request("POST", core(namespace, "configmaps"), config_map("settings", mode="safe"))
    ref = await Discovery(kube).resolve("configmap", namespace, "settings")
    saga = await agent(cluster, namespace)
    reader = ActAs(user=f"system:serviceaccount:{namespace}:reader")
    before = await Objects(kube).get(ref)
    run = await saga.register("patch-settings", None, kubernetes=ObjectUndo(object=ref, before=before, act_as=reader))
    patch = {"data": {"mode": "fast"}}
    await kube.request("PATCH", core(namespace, "configmaps", "settings"), patch, content_type=MERGE)
    run.left = object_undo.left(await Objects(kube).get(ref))
    await saga.finish(run)
    halted = await saga_phase(kube, namespace, await aborted(saga), "Halted")
    entry = await kube.get("undoentries", namespace, f"{halted['metadata']['name']}-1")
    assert (entry["status"]["state"], entry["status"]["reason"]) == ("Failed", "Forbidden")
    said = entry["status"]["lastError"]
    assert f"system:serviceaccount:{namespace}:reader" in said
    assert 'cannot patch resource "configmaps"' in said
    assert (await kube.request("GET", core(namespace, "configmaps", "settings")))["data"] == {"mode": "fast"}


async def test_an_entry_may_act_only_as_its_creator_or_whom_its_creator_may_impersonate(
    kube: Kube, namespace: str, cluster: Cluster, tmp_path: Path
) -> None:
    """Writing an UndoEntry grants nothing: an agent that may write entries but impersonate no
    one is refused an entry acting as another ServiceAccount (at admission, naming the fix), and
    may have one act as itself."""
    ledger_rights = {
        "apiGroups": ["undolog.io"],
        "resources": ["sagas", "undoentries"],
        "verbs": ["get", "create", "delete"],
    }
    await granted(kube, namespace, "agent", [ledger_rights])
    await create_service_account(kube, namespace, "admin-bot")
    config = await service_account_kubeconfig(kube, cluster.kubeconfig, namespace, "agent", tmp_path / "agent", False)
    async with await Kube.connect(str(config)) as as_agent:
        created = await as_agent.create("sagas", namespace, saga_manifest("work"))
        ref = await Discovery(kube).resolve("configmap", namespace, "anything")
        owner = Saga.model_validate(created)
        for user, refused in ((f"system:serviceaccount:{namespace}:admin-bot", True), (await as_agent.whoami(), False)):
            undo = ObjectUndo(object=ref, before=None, act_as=ActAs(user=user))
            body = creation_body(new_undo_entry(owner, 1, "step", None, kubernetes=undo))
            if refused:
                message = await refusal(as_agent, namespace, body)
                print(f"\nrefused: {message}")
                assert f"may not have the operator act as system:serviceaccount:{namespace}:admin-bot" in message
                assert "grant" in message
            else:
                await as_agent.create("undoentries", namespace, body)


async def test_an_orchestrated_step_s_object_is_undone_natively_as_the_account_it_names(
    kube: Kube, namespace: str, cluster: Cluster, participant: Participant, operator: OperatorProcess
) -> None:
    """A saga manifest's step whose action (a Webhook) patches a ConfigMap names the object and
    the ServiceAccount to act as: the operator reads it before and after the action, and when a
    later step fails puts back only what the action changed, as that account."""
    await granted(
        kube, namespace, "deployer", [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "patch"]}]
    )
    await kube.request("POST", core(namespace, "configmaps"), config_map("settings", mode="safe", size="s"))

    def set_mode(_: Received) -> Reply:
        patch = '{"data": {"mode": "fast"}}'
        kubectl = [str(REPO / "bin" / "kubectl"), "--kubeconfig", str(cluster.kubeconfig), "-n", namespace]
        subprocess.run([*kubectl, "patch", "configmap", "settings", "--type=merge", "-p", patch], check=True)
        return Reply(200, {"mode": "fast"})

    participant.handle("/set-mode", set_mode)
    participant.script("/place-order", Reply(400, {"error": "out of stock"}))
    for function in ("set-mode", "place-order", "cancel-order"):
        await kube.create("webhooks", namespace, webhook(function, url=participant.url(f"/{function}")))
    steps = [
        {
            "name": "set_mode",
            "action": {"function": "set-mode"},
            "kubernetes": {
                "resource": "configmap",
                "name": "settings",
                "serviceAccount": "deployer",
                "changes": {"data": {"mode": ""}},
            },
        },
        {"name": "order", "action": {"function": "place-order"}, "compensation": {"function": "cancel-order"}},
    ]
    await kube.create("sagas", namespace, saga_manifest("release", steps))
    await saga_phase(kube, namespace, "release", "Compensated")
    settings = await kube.request("GET", core(namespace, "configmaps", "settings"))
    assert settings["data"] == {"mode": "safe", "size": "s"}
    entry = await kube.get("undoentries", namespace, "release-1")
    assert entry["spec"]["kubernetes"]["actAs"]["user"] == f"system:serviceaccount:{namespace}:deployer"
    assert entry["status"]["guard"]["after"]["data"]["mode"] == "fast"


async def test_a_saga_may_name_only_an_account_its_creator_may_act_as(
    kube: Kube, namespace: str, cluster: Cluster, tmp_path: Path
) -> None:
    rights = {"apiGroups": ["undolog.io"], "resources": ["sagas"], "verbs": ["get", "create", "delete"]}
    await granted(kube, namespace, "author", [rights])
    await create_service_account(kube, namespace, "admin-bot")
    config = await service_account_kubeconfig(kube, cluster.kubeconfig, namespace, "author", tmp_path / "author", False)
    named = {"resource": "configmap", "name": "settings", "serviceAccount": "admin-bot"}
    steps = [{"name": "set_mode", "action": {"function": "set-mode"}, "kubernetes": named}]
    async with await Kube.connect(str(config)) as as_author:
        with pytest.raises(errors.KubeError) as refused:
            await as_author.create("sagas", namespace, saga_manifest("release", steps))
    print(f"\nrefused: {refused.value.message}")
    assert "may not have the operator act as the ServiceAccounts its steps name" in refused.value.message
    await kube.create("sagas", namespace, saga_manifest("release", steps))  # its admin may


async def test_an_orchestrated_step_whose_object_cannot_be_read_sends_nothing_and_says_why(
    kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess
) -> None:
    """The account a step names may not read its object: nothing is registered or sent, and
    the saga's Events say which object, which account and what the API refused."""
    await create_service_account(kube, namespace, "nobody")
    await kube.request("POST", core(namespace, "configmaps"), config_map("settings", mode="safe"))
    await kube.create("webhooks", namespace, webhook("set-mode", url=participant.url("/set-mode")))
    named = {"resource": "configmap", "name": "settings", "serviceAccount": "nobody"}
    steps = [{"name": "set_mode", "action": {"function": "set-mode"}, "kubernetes": named}]
    await kube.create("sagas", namespace, saga_manifest("release", steps))
    account = f"system:serviceaccount:{namespace}:nobody"
    events = await eventually(
        lambda: kube.events_about(namespace, "release"),
        lambda found: any("could not be read as" in e.message for e in found),
        30,
        "an Event saying why the step waits",
    )
    said = next(e.message for e in events if "could not be read as" in e.message)
    print(f"\n{said}")
    assert f"step set_mode: configmap settings could not be read as {account} before its action" in said
    assert 'cannot get resource "configmaps"' in said
    assert participant.received("/set-mode") == []
    assert await kube.list("undoentries", namespace) == []
