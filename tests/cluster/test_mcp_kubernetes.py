"""The catalog's Kubernetes entry (charts/undolog/catalog/kubernetes.yaml) against the real
mcp-server-kubernetes from npm, run as the catalog runs it (a stdio command of the gateway,
kubectl on the test control plane): an agent authenticated by its ServiceAccount token scales,
patches, creates and deletes real Deployments, ConfigMaps and Secrets; a second writer changes
some of them meanwhile; the agent aborts. The operator undoes each object natively, as the
agent's account: only what the call changed, only where nothing changed it since."""

from __future__ import annotations

import asyncio
import base64
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml
from devtools.control_plane.local import free_port
from mcp import Client

from tests.cluster.test_mcp_auth import agent, service_account_token
from tests.cluster.test_mcp_gateway import only_saga
from tests.cluster.test_mcp_stateless import HANDLE, handle_of
from tests.cluster.test_object_undo import MERGE, apps, config_map, core, deployment, granted
from tests.conftest import REPO, Cluster
from tests.support.gateway_process import GatewayProcess
from tests.support.waiting import eventually, saga_phase
from undolog import errors
from undolog.inspect import Inspector
from undolog.kube import Kube

pytestmark = pytest.mark.cluster
SERVER = REPO / "tests" / "mcp_servers" / "node_modules" / ".bin" / "mcp-server-kubernetes"
OBJECT_RIGHTS = [
    {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "patch", "delete", "create"]},
    {"apiGroups": [""], "resources": ["configmaps", "secrets"], "verbs": ["get", "patch", "delete", "create"]},
]


def kubernetes_catalog(cluster: Cluster) -> dict[str, Any]:
    """The catalog file's gateway configuration, its command the installed server's, kubectl the
    one built for the tests."""
    config = yaml.safe_load((REPO / "charts/undolog/catalog/kubernetes.yaml").read_text())["gateway"]["config"]
    npx, _, package = config["upstreams"]["kubernetes"]["command"]
    assert (npx, package) == ("npx", "mcp-server-kubernetes@4.1.7")
    env = {"KUBECONFIG": str(cluster.kubeconfig), "PATH": f"{REPO / 'bin'}:{os.environ['PATH']}"}
    return {"upstreams": {"kubernetes": {"command": [str(SERVER)], "env": env}}, "tools": config["tools"]}


class Gateway:
    def __init__(self, cluster: Cluster, namespace: str, tmp_path: Path) -> None:
        port = free_port()
        self.resource = f"http://127.0.0.1:{port}/mcp"
        auth = {"resource": self.resource, "serviceAccounts": True}
        config = {"namespace": namespace, "auth": auth, **kubernetes_catalog(cluster)}
        self.process = GatewayProcess(cluster.kubeconfig, config, tmp_path, port=port)


@pytest_asyncio.fixture
async def gateway(cluster: Cluster, namespace: str, tmp_path: Path) -> AsyncIterator[Gateway]:
    served = Gateway(cluster, namespace, tmp_path)
    yield served
    served.process.stop()


async def objects(kube: Kube, namespace: str) -> None:
    await kube.request("POST", apps(namespace), deployment("web", 2))
    await kube.request("POST", apps(namespace), deployment("api", 2))
    await kube.request("POST", core(namespace, "configmaps"), config_map("settings", mode="safe", size="s"))
    await kube.request("POST", core(namespace, "configmaps"), config_map("old", keep="me"))
    secret = {"metadata": {"name": "creds"}, "stringData": {"password": "before"}}
    await kube.request("POST", core(namespace, "secrets"), secret)
    await kube.request("POST", core(namespace, "configmaps"), config_map("flags", on="yes"))


def steps(namespace: str) -> list[tuple[str, dict[str, Any]]]:
    """The agent's calls, oldest first: the scale a second writer will change again comes first,
    so that every newer undo goes before its Conflict halts the saga."""
    at = {"namespace": namespace}
    template = {"spec": {"template": {"spec": {"containers": [{"name": "web", "image": "registry.invalid/web:2"}]}}}}
    relabel = {"metadata": {"labels": {"tier": "silver"}}}
    return [
        ("kubectl_scale", {"name": "web", "replicas": 5, **at}),
        (
            "kubectl_patch",
            {"resourceType": "configmap", "name": "flags", "patchType": "merge", "patchData": relabel, **at},
        ),
        (
            "kubectl_patch",
            {"resourceType": "deployment", "name": "api", "patchType": "merge", "patchData": template, **at},
        ),
        (
            "kubectl_patch",
            {
                "resourceType": "configmap",
                "name": "settings",
                "patchType": "merge",
                "patchData": {"data": {"mode": "fast"}, "metadata": {"labels": {"tier": "silver"}}},
                **at,
            },
        ),
        (
            "kubectl_patch",
            {
                "resourceType": "secret",
                "name": "creds",
                "patchType": "merge",
                "patchData": {"data": {"password": base64.b64encode(b"after").decode()}},
                **at,
            },
        ),
        ("kubectl_delete", {"resourceType": "configmap", "name": "old", **at}),
        ("kubectl_create", {"resourceType": "configmap", "name": "fresh", "fromLiteral": ["new=yes"], **at}),
    ]


@pytest.mark.usefixtures("operator")
async def test_an_agent_s_kubernetes_changes_are_undone_natively_and_later_changes_are_kept(
    kube: Kube, namespace: str, gateway: Gateway
) -> None:
    await objects(kube, namespace)
    await granted(kube, namespace, "agent", OBJECT_RIGHTS)
    token = await service_account_token(kube, namespace, "agent", gateway.resource)
    async with agent(gateway.process.url, token, "auto") as called:
        handle = None
        for tool, args in steps(namespace):
            answer = await called.call_tool(tool, args | ({HANDLE: handle} if handle else {}))
            assert not answer.is_error, (tool, answer)
            handle = handle_of(answer)
        assert (await kube.request("GET", apps(namespace, "web")))["spec"]["replicas"] == 5
        # A second writer (a person, an autoscaler) scales web again, relabels flags again, and
        # changes another key of settings.
        await kube.request("PATCH", apps(namespace, "web"), {"spec": {"replicas": 10}}, content_type=MERGE)
        bronze = {"metadata": {"labels": {"tier": "bronze"}}}
        await kube.request("PATCH", core(namespace, "configmaps", "flags"), bronze, content_type=MERGE)
        later = {"data": {"size": "xl"}}
        await kube.request("PATCH", core(namespace, "configmaps", "settings"), later, content_type=MERGE)
        await called.call_tool("undolog_abort", {HANDLE: handle, "reason": "undo the lot"})
    name = await only_saga(kube, namespace)
    halted = await saga_phase(kube, namespace, name, "Halted", within=60)
    assert halted["status"]["reason"] == "Conflict"
    entries = {e["spec"]["stackPosition"]: e for e in await kube.list("undoentries", namespace)}
    print("\n" + "\n".join(f"{p}: {e['spec']['step']} {e['status']['state']}" for p, e in sorted(entries.items())))
    # Newest first: the five nobody touched undone, then the relabel halted (the scale below it waits).
    assert [entries[p]["status"]["state"] for p in range(7, 0, -1)] == ["Compensated"] * 5 + ["Failed", "Pending"]
    assert entries[2]["spec"]["kubernetes"]["actAs"]["user"] == f"system:serviceaccount:{namespace}:agent"
    flags = entries[2]["status"]["guard"]
    assert (entries[2]["status"]["reason"], flags["differing"]) == ("Conflict", ["metadata.labels.tier"])
    labels = (await kube.request("GET", core(namespace, "configmaps", "flags")))["metadata"]["labels"]
    assert labels == {"tier": "bronze"}  # the later change kept
    await Inspector(kube).skip(namespace, name, 2, "the person's bronze stays")
    await eventually(
        lambda: kube.get("undoentries", namespace, f"{name}-1"),
        lambda e: e["status"].get("reason") == "Conflict",
        30,
        "the scale's undo halted as Conflict",
    )
    # The entry's Conflict is written before the saga halts; a skip is taken only of a Halted saga.
    await saga_phase(kube, namespace, name, "Halted", within=30)
    web = (await kube.get("undoentries", namespace, f"{name}-1"))["status"]["guard"]
    assert web["differing"] == ["spec.replicas"]
    assert (await kube.request("GET", apps(namespace, "web")))["spec"]["replicas"] == 10  # the later change kept
    api = await kube.request("GET", apps(namespace, "api"))
    assert api["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.invalid/web:1"
    settings = await kube.request("GET", core(namespace, "configmaps", "settings"))
    assert (settings["data"], settings["metadata"]["labels"]) == ({"mode": "safe", "size": "xl"}, {"tier": "gold"})
    creds = await kube.request("GET", core(namespace, "secrets", "creds"))
    assert base64.b64decode(creds["data"]["password"]) == b"before"
    old = await kube.request("GET", core(namespace, "configmaps", "old"))
    assert (old["data"], old["metadata"]["labels"]) == ({"keep": "me"}, {"tier": "gold"})
    with pytest.raises(errors.NotFound):
        await kube.request("GET", core(namespace, "configmaps", "fresh"))
    await Inspector(kube).skip(namespace, name, 1, "the autoscaler's 10 replicas stay")
    await saga_phase(kube, namespace, name, "Compensated", within=30)
    assert (await kube.request("GET", apps(namespace, "web")))["spec"]["replicas"] == 10


@pytest.mark.usefixtures("operator")
async def test_the_undo_refused_for_a_missing_right_names_it_and_changes_nothing(
    kube: Kube, namespace: str, gateway: Gateway
) -> None:
    """The agent's account may get and patch the ConfigMap (the server patches with its own
    kubeconfig) but not patch it back: the gateway reads it as the agent, the undo acts as the
    agent, and the API's refusal halts the saga naming the account and the right."""
    await kube.request("POST", core(namespace, "configmaps"), config_map("settings", mode="safe"))
    await granted(kube, namespace, "agent", [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}])
    token = await service_account_token(kube, namespace, "agent", gateway.resource)
    patch = {"resourceType": "configmap", "name": "settings", "namespace": namespace, "patchType": "merge"}
    async with agent(gateway.process.url, token, "auto") as called:
        answer = await called.call_tool("kubectl_patch", patch | {"patchData": {"data": {"mode": "fast"}}})
        assert not answer.is_error, answer
        await called.call_tool("undolog_abort", {HANDLE: handle_of(answer), "reason": "undo it"})
    name = await only_saga(kube, namespace)
    halted = await saga_phase(kube, namespace, name, "Halted", within=60)
    entry = await eventually(
        lambda: kube.get("undoentries", namespace, f"{name}-1"), lambda e: "reason" in e["status"], 10, "its reason"
    )
    print(f"\n{entry['status']['lastError']}")
    assert entry["status"]["reason"] == "Forbidden"
    assert f"system:serviceaccount:{namespace}:agent" in entry["status"]["lastError"]
    assert 'cannot patch resource "configmaps"' in entry["status"]["lastError"]
    assert halted["status"]["reason"] == "CompensationFailed"
    assert (await kube.request("GET", core(namespace, "configmaps", "settings")))["data"] == {"mode": "fast"}


@pytest.mark.usefixtures("operator")
async def test_an_undo_the_server_refuses_with_a_json_rpc_error_halts_in_its_own_words(
    cluster: Cluster, kube: Kube, namespace: str, tmp_path: Path
) -> None:
    """Mapped to the server's own tool instead of natively: a deleted ConfigMap undone by
    kubectl_create. Someone creates it again first; the server refuses the undo with a JSON-RPC
    error (AlreadyExists, which this server sends as -32603, an internal error: asked again as
    the retry policy says), and the saga halts when the policy's attempts are spent, not after
    the outage budget, with the server's own message on the entry, its Events and `undolog show`."""
    from tests.cluster.test_mcp_catalog import serving_operator_calls

    await kube.request("POST", core(namespace, "configmaps"), config_map("old", keep="me"))
    at = {"resourceType": "configmap", "name": "old", "namespace": namespace}
    undo = {k: f"${{args.{k}}}" for k in at} | {"fromLiteral": ["keep=me"]}
    mapped = {"compensation": {"tool": "kubernetes.kubectl_create", "args": undo}}
    config = kubernetes_catalog(cluster) | {"tools": {"kubernetes.kubectl_delete": mapped}}
    gateway = await serving_operator_calls(cluster.kubeconfig, kube, namespace, tmp_path, config)
    try:
        async with Client(gateway.url) as called:
            answer = await called.call_tool("kubectl_delete", at)
            assert not answer.is_error, answer
            with pytest.raises(errors.NotFound):
                await kube.request("GET", core(namespace, "configmaps", "old"))
            again = config_map("old", keep="someone else's")
            await kube.request("POST", core(namespace, "configmaps"), again)  # someone else's
            await called.call_tool("undolog_abort", {HANDLE: handle_of(answer), "reason": "undo it"})
        name = await only_saga(kube, namespace)
        halted = await saga_phase(kube, namespace, name, "Halted", within=60)
    finally:
        gateway.stop()
    entry = await kube.get("undoentries", namespace, f"{name}-1")
    said = entry["status"]["lastError"]
    print(f"\n{said}\nattempts: {len(entry['status']['attempts'])}")
    assert said.startswith("MCP error ")  # the server's JSON-RPC refusal, in its own words
    assert 'configmaps "old" already exists' in said
    assert entry["status"]["reason"] == "RetriesExhausted"  # the retry policy's 4 attempts, seconds apart
    assert len([a for a in entry["status"]["attempts"] if a["kind"] == "Compensation"]) == 4
    assert halted["status"]["reason"] == "CompensationFailed"
    events = (await kube.request("GET", core(namespace, "events")))["items"]
    assert any("already exists" in e.get("message", "").lower() for e in events)
    show = [sys.executable, "-m", "undolog.cli", "show", name, "-n", namespace, "--kubeconfig", str(cluster.kubeconfig)]
    shown = (await asyncio.to_thread(subprocess.run, show, capture_output=True, text=True, check=True)).stdout
    assert "already exists" in shown.lower()
    kept = await kube.request("GET", core(namespace, "configmaps", "old"))
    assert kept["data"] == {"keep": "someone else's"}
