"""The catalog (charts/undolog/catalog/): the mappings of three MCP servers from the npm
registry, each run as the catalog runs it (a stdio command of the gateway, installed by `make
mcp-servers`), proven against the real server: every step an agent on today's client makes
undone, newest first, by the operator calling the servers' own tools through the gateway
(/upstreams/<name>/mcp, signed and fenced as any call)."""

from __future__ import annotations

import base64
import json
import sqlite3
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
import yaml
from devtools.control_plane.local import free_port
from mcp import Client
from mcp.shared.exceptions import MCPError

from tests.cluster.test_mcp_gateway import only_saga
from tests.cluster.test_mcp_stateless import HANDLE, handle_of
from tests.conftest import REPO, Cluster
from tests.support.gateway_process import GatewayProcess
from tests.support.waiting import eventually, saga_phase
from undolog.calls import protocol
from undolog.calls.signing import webhook_headers
from undolog.inspect import Inspector
from undolog.kube import Kube

pytestmark = pytest.mark.cluster
CATALOG = REPO / "charts" / "undolog" / "catalog"
SERVERS = REPO / "tests" / "mcp_servers" / "node_modules" / ".bin"
BINARIES = {  # the npm package of each catalog command, and the command it installs
    "@modelcontextprotocol/server-memory": "mcp-server-memory",
    "@modelcontextprotocol/server-filesystem": "mcp-server-filesystem",
    "mcp-sqlite": "mcp-sqlite-server",
}
SIGNING = "whsec_" + base64.b64encode(b"the-gateway-operator-calls-key-!").decode()


def catalog(tmp_path: Path) -> dict[str, Any]:
    """Every catalog file's gateway configuration, merged, its commands the installed servers'
    and its /data the test's own folder."""
    upstreams: dict[str, Any] = {}
    tools: dict[str, Any] = {}
    for path in sorted(CATALOG.glob("*.yaml")):
        if path.name == "kubernetes.yaml":  # needs a caller to act as: tests/cluster/test_mcp_kubernetes.py
            continue
        config = yaml.safe_load(path.read_text())["gateway"]["config"]
        for name, upstream in config["upstreams"].items():
            npx, _, package, *args = upstream["command"]
            assert npx == "npx", path
            binary = BINARIES[package.rsplit("@", 1)[0]]
            local = [str(SERVERS / binary), *(a.replace("/data", str(tmp_path / "data")) for a in args)]
            upstreams[name] = {"command": local, "env": {"MEMORY_FILE_PATH": str(tmp_path / "memory.jsonl")}}
        tools |= config["tools"]
    return {"upstreams": upstreams, "tools": tools}


@pytest.fixture
def data(tmp_path: Path) -> Path:
    """What the agent works on: two files, and a users table with one row."""
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "notes.txt").write_text("first draft\n")
    (folder / "todo.txt").write_text("a\nb\n")
    with sqlite3.connect(folder / "app.db") as db:
        db.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, email TEXT, plan TEXT)")
        db.execute("INSERT INTO users (email, plan) VALUES ('ada@example.com', 'free')")
        db.execute("INSERT INTO users (email, plan) VALUES ('bob@example.com', 'free')")
    return folder


async def serving_operator_calls(
    kubeconfig: Path, kube: Kube, namespace: str, tmp_path: Path, config: dict[str, Any], port: int | None = None
) -> GatewayProcess:
    """The gateway serving its stdio servers' compensations (and those of upstreams it holds
    credentials for) to the operator: it makes their Webhooks at start, signed with the Secret
    it checks the calls against."""
    secret = {"metadata": {"name": "operator-calls", "labels": {"undolog.io/webhook-headers": "true"}}}
    await kube.request("POST", f"/api/v1/namespaces/{namespace}/secrets", secret | {"stringData": {"key": SIGNING}})
    port = port or free_port()
    calls = {"url": f"http://127.0.0.1:{port}", "signingSecret": "operator-calls"}
    return GatewayProcess(kubeconfig, {"namespace": namespace, **config, "operatorCalls": calls}, tmp_path, port=port)


@pytest_asyncio.fixture
async def gateway(
    cluster: Cluster, kube: Kube, namespace: str, tmp_path: Path, data: Path
) -> AsyncIterator[GatewayProcess]:
    process = await serving_operator_calls(cluster.kubeconfig, kube, namespace, tmp_path, catalog(tmp_path))
    yield process
    process.stop()


def users(data: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(data / "app.db") as db:
        return db.execute("SELECT id, email, plan FROM users ORDER BY id").fetchall()


def graph(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "memory.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


STEPS: list[tuple[str, dict[str, Any]]] = [
    (
        "create_entities",
        {
            "entities": [
                {"name": "ada", "entityType": "person", "observations": ["likes tea"]},
                {"name": "bob", "entityType": "person", "observations": []},
            ]
        },
    ),
    ("add_observations", {"observations": [{"entityName": "ada", "contents": ["writes code"]}]}),
    ("create_relations", {"relations": [{"from": "ada", "to": "bob", "relationType": "knows"}]}),
    ("write_file", {"path": "notes.txt", "content": "second draft\n"}),
    ("edit_file", {"path": "todo.txt", "edits": [{"oldText": "a", "newText": "A"}]}),
    ("move_file", {"source": "todo.txt", "destination": "done.txt"}),
    ("create_record", {"table": "users", "data": {"email": "cy@example.com", "plan": "free"}}),
    ("update_records", {"table": "users", "data": {"plan": "pro"}, "conditions": {"id": 1}}),
]


def in_data(args: dict[str, Any], data: Path) -> dict[str, Any]:
    """The filesystem server's paths are absolute: the test's data folder."""
    return {k: str(data / v) if k in ("path", "source", "destination") else v for k, v in args.items()}


@pytest.mark.usefixtures("operator")
async def test_every_catalog_server_s_steps_are_undone_newest_first(
    kube: Kube, namespace: str, gateway: GatewayProcess, data: Path, tmp_path: Path
) -> None:
    hooks = {h["metadata"]["name"]: h["spec"]["versions"][0] for h in await kube.list("webhooks", namespace)}
    mapped = catalog(tmp_path)["tools"].values()
    undone = {r["compensation"]["tool"] for r in mapped if "compensation" in r}
    undone |= {r["before"]["tool"] for r in mapped if "after" in r}  # what the guards read again
    assert sorted(hooks) == sorted(tool.lower().replace("_", "-") for tool in undone)  # made by the gateway
    assert hooks["memory.delete-entities"]["url"] == f"{gateway.base}/upstreams/memory/mcp"
    async with Client(gateway.url) as agent:  # today's client: the stateless revision
        handle = None
        for tool, args in STEPS:
            called = await agent.call_tool(tool, in_data(args, data) | ({HANDLE: handle} if handle else {}))
            assert not called.is_error, (tool, called)
            handle = handle_of(called)
        assert len(graph(tmp_path)) == 3  # two entities and a relation
        assert (data / "notes.txt").read_text() == "second draft\n"
        assert (data / "done.txt").read_text() == "A\nb\n"
        assert users(data) == [
            (1, "ada@example.com", "pro"),
            (2, "bob@example.com", "free"),
            (3, "cy@example.com", "free"),
        ]
        await agent.call_tool("undolog_abort", {HANDLE: handle, "reason": "undo the lot"})
    name = await only_saga(kube, namespace)
    await saga_phase(kube, namespace, name, "Compensated", within=60)
    entries = sorted(await kube.list("undoentries", namespace), key=lambda e: e["spec"]["stackPosition"])
    print("\n" + "\n".join(f"{e['spec']['step']}: {e['spec']['compensation']['args']}" for e in entries))
    assert graph(tmp_path) == []
    assert (data / "notes.txt").read_text() == "first draft\n"
    assert (data / "todo.txt").read_text() == "a\nb\n"
    assert not (data / "done.txt").exists()
    assert users(data) == [(1, "ada@example.com", "free"), (2, "bob@example.com", "free")]


@pytest.mark.usefixtures("operator")
async def test_a_file_or_row_changed_again_since_is_kept_and_its_undo_halts_as_conflict(
    kube: Kube, namespace: str, gateway: GatewayProcess, data: Path
) -> None:
    """Agent A writes two files and updates a row; a second writer then edits one file and the
    row. A aborts: the file nobody touched is undone, and the two later changes are kept, each
    undo halted as Conflict (before, after and now on the entry) for a person."""
    steps: list[tuple[str, dict[str, Any]]] = [
        ("write_file", {"path": "notes.txt", "content": "second draft\n"}),
        ("update_records", {"table": "users", "data": {"plan": "pro"}, "conditions": {"id": 1}}),
        ("write_file", {"path": "todo.txt", "content": "nothing left\n"}),
    ]
    async with Client(gateway.url) as agent:
        handle = None
        for tool, args in steps:
            called = await agent.call_tool(tool, in_data(args, data) | ({HANDLE: handle} if handle else {}))
            assert not called.is_error, (tool, called)
            handle = handle_of(called)
        (data / "notes.txt").write_text("third draft, by a person\n")  # the second writer
        with sqlite3.connect(data / "app.db") as db:
            db.execute("UPDATE users SET plan = 'enterprise' WHERE id = 1")
        await agent.call_tool("undolog_abort", {HANDLE: handle, "reason": "undo the lot"})
    name = await only_saga(kube, namespace)
    halted = await saga_phase(kube, namespace, name, "Halted", within=60)
    assert halted["status"]["reason"] == "Conflict"
    entries = {e["spec"]["stackPosition"]: e for e in await kube.list("undoentries", namespace)}
    assert [entries[p]["status"]["state"] for p in (3, 2)] == ["Compensated", "Failed"]
    row = entries[2]
    assert (row["status"]["reason"], row["status"]["guard"]["differing"]) == ("Conflict", ["[0].plan"])
    assert row["spec"]["guard"]["before"] == [{"id": 1, "email": "ada@example.com", "plan": "free"}]
    assert row["status"]["guard"]["after"] == [{"id": 1, "email": "ada@example.com", "plan": "pro"}]
    assert row["status"]["guard"]["now"] == [{"id": 1, "email": "ada@example.com", "plan": "enterprise"}]
    assert users(data) == [(1, "ada@example.com", "enterprise"), (2, "bob@example.com", "free")]
    assert (data / "todo.txt").read_text() == "a\nb\n"
    await Inspector(kube).skip(namespace, name, 2, "the person's plan stays")
    await eventually(
        lambda: kube.get("undoentries", namespace, f"{name}-1"),
        lambda e: e["status"].get("reason") == "Conflict",
        30,
        "the file's undo halted as Conflict",
    )
    assert (data / "notes.txt").read_text() == "third draft, by a person\n"
    file_entry = await kube.get("undoentries", namespace, f"{name}-1")
    assert file_entry["status"]["guard"]["now"] == "third draft, by a person\n"
    assert file_entry["spec"]["guard"]["before"] == "first draft\n"


@pytest.mark.usefixtures("operator")
async def test_what_the_catalog_cannot_undo_is_refused_before_anything_is_done(
    gateway: GatewayProcess, data: Path
) -> None:
    async with Client(gateway.url) as agent:
        with pytest.raises(MCPError, match=r"not called: the state before it could not be read"):
            await agent.call_tool("write_file", {"path": str(data / "new.txt"), "content": "x"})  # no tool deletes it
        with pytest.raises(MCPError, match=r"refused: the update matches more than one row"):
            await agent.call_tool("update_records", {"table": "users", "data": {"plan": "pro"}, "conditions": {}})
    assert not (data / "new.txt").exists()
    assert users(data) == [(1, "ada@example.com", "free"), (2, "bob@example.com", "free")]


async def test_the_operator_s_door_refuses_what_the_operator_did_not_send(gateway: GatewayProcess) -> None:
    """/upstreams/<name>/mcp serves only the compensation tools, only to signed calls with a
    fence no older than its shard has seen."""
    listing = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    payload = json.dumps(listing, separators=(",", ":")).encode()

    def signed(key: str, fence: int) -> dict[str, str]:
        sent = protocol.headers(idempotency_key=key, saga="t/s", step="s", org=None, attempt=1)
        return (
            sent
            | webhook_headers(key, payload, [SIGNING], datetime.now(UTC))
            | {
                protocol.FENCE_HEADER: str(fence),
                protocol.SHARD_HEADER: "0/1",
                "MCP-Protocol-Version": "2025-11-25",
            }
        )

    def post(headers: dict[str, str], upstream: str = "memory") -> httpx.Response:
        return httpx.post(
            f"{gateway.base}/upstreams/{upstream}/mcp",
            content=payload,
            headers={"Content-Type": "application/json", "Accept": "application/json, text/event-stream", **headers},
            timeout=10,
        )

    assert post({}).status_code == 401  # not signed
    listed = post(signed("undo-1", 7))
    assert listed.status_code == 200, listed.text
    names = sorted(t["name"] for t in listed.json()["result"]["tools"])
    assert names == ["delete_entities", "delete_observations", "delete_relations"]  # the compensations only
    older = post(signed("undo-2", 6))
    assert older.status_code == 409, older.text  # an operator replaced while it was frozen
    assert post(signed("undo-3", 7)).status_code == 200
    assert post(signed("undo-4", 7), upstream="nothing").status_code == 404
