"""The undo residue: what an aborted agent session leaves behind on real MCP servers.

Scripted sessions on the catalog's servers (filesystem, SQLite and memory from the npm registry,
run as the catalog runs them) and on mcp-server-git (PyPI), modelled on MCPMark's task families
for local servers (multi-step create/update/delete work): each session of N calls is run N
times through `undolog mcp` with the catalog's mappings, aborted after its first k calls (k = 1
to N), and the operator undoes it; the store (files, rows, the graph, the repository) is then
compared with its snapshot from before the session. A call that changed the store is an effect
made; an effect left is one whose change is still there, named by its tool and why: the tool is
irreversible by design (the catalog asks a person first, and the bench's agent accepts), or a
gap.

    python -m bench.residue
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mcp_types as types
from mcp import Client
from tests.cluster.test_mcp_catalog import catalog, serving_operator_calls
from tests.cluster.test_mcp_git import git_config
from tests.support.waiting import eventually

from bench.harness import Bench, bench_cluster, print_table, save

Store = dict[str, str]  # an item of the store (a file, a row, a graph record, a ref) -> its content
Call = tuple[str, dict[str, Any]]
HANDLE = "undolog_saga"
ENDED = ("Compensated", "Halted", "Failed")
ROWS: dict[str, list[tuple[int, str | int, str | int]]] = {  # the SQLite session's tables before it
    "users": [(1, "ada@example.com", "free"), (2, "bob@example.com", "free")],
    "orders": [(1, 1, 10)],
}


@dataclass
class Session:
    server: str
    calls: list[Call]
    reset: Callable[[], None]
    read: Callable[[], Store]
    confirmed: frozenset[str]  # tools the catalog asks a person about: irreversible by design


@dataclass
class Residue:
    made: int = 0
    left: int = 0
    runs: int = 0
    leaving: dict[str, set[str]] = field(default_factory=dict)  # tool -> why it left an effect


def files(folder: Path) -> Callable[[], Store]:
    def read() -> Store:
        return {str(p.relative_to(folder)): p.read_text() for p in sorted(folder.rglob("*")) if p.is_file()}

    return read


def filesystem(data: Path) -> Session:
    folder = data / "files"
    originals = {"notes.txt": "first draft\n", "todo.txt": "a\nb\n", "readme.md": "# shop\n", "config.json": "{}\n"}

    def reset() -> None:
        subprocess.run(["rm", "-rf", str(folder)], check=True)
        folder.mkdir(parents=True)
        for name, text in originals.items():
            (folder / name).write_text(text)

    def at(name: str) -> str:
        return str(folder / name)

    calls: list[Call] = [
        ("write_file", {"path": at("notes.txt"), "content": "second draft\n"}),
        ("edit_file", {"path": at("todo.txt"), "edits": [{"oldText": "a", "newText": "A"}]}),
        ("move_file", {"source": at("todo.txt"), "destination": at("done.txt")}),
        ("write_file", {"path": at("readme.md"), "content": "# shop\n\nOpen 9-5.\n"}),
        ("edit_file", {"path": at("readme.md"), "edits": [{"oldText": "9-5", "newText": "8-6"}]}),
        ("create_directory", {"path": at("archive")}),
        ("move_file", {"source": at("notes.txt"), "destination": at("archive/notes.txt")}),
        ("write_file", {"path": at("config.json"), "content": '{"theme": "dark"}\n'}),
        ("edit_file", {"path": at("config.json"), "edits": [{"oldText": "dark", "newText": "light"}]}),
        ("move_file", {"source": at("config.json"), "destination": at("archive/config.json")}),
    ]

    def read() -> Store:
        found = files(folder)()
        found |= {f"{p.relative_to(folder)}/": "dir" for p in sorted(folder.rglob("*")) if p.is_dir()}
        return found

    return Session("filesystem", calls, reset, read, frozenset({"create_directory"}))


def sqlite(data: Path) -> Session:
    path = data / "app.db"

    def reset() -> None:  # in place: the server keeps the file open
        with sqlite3.connect(path) as db:
            db.execute("CREATE TABLE IF NOT EXISTS users (id INTEGER PRIMARY KEY, email TEXT, plan TEXT)")
            db.execute("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, user_id INTEGER, total INTEGER)")
            for table, kept in ROWS.items():
                db.execute(f"DELETE FROM {table}")
                marks = ", ".join("?" * len(kept[0]))
                db.executemany(f"INSERT INTO {table} VALUES ({marks})", kept)

    def read() -> Store:
        with sqlite3.connect(path) as db:
            return {
                f"{table}/{row[0]}": json.dumps(row)
                for table in ROWS
                for row in db.execute(f"SELECT * FROM {table} ORDER BY id")
            }

    calls: list[Call] = [
        ("create_record", {"table": "users", "data": {"email": "cy@example.com", "plan": "free"}}),
        ("update_records", {"table": "users", "data": {"plan": "pro"}, "conditions": {"id": 1}}),
        ("create_record", {"table": "orders", "data": {"user_id": 1, "total": 25}}),
        ("update_records", {"table": "orders", "data": {"total": 12}, "conditions": {"id": 1}}),
        ("update_records", {"table": "users", "data": {"email": "bob@shop.example"}, "conditions": {"id": 2}}),
        ("create_record", {"table": "users", "data": {"email": "dee@example.com", "plan": "trial"}}),
        ("delete_records", {"table": "orders", "conditions": {"id": 1}}),
        ("update_records", {"table": "users", "data": {"plan": "enterprise"}, "conditions": {"id": 2}}),
        ("create_record", {"table": "orders", "data": {"user_id": 2, "total": 5}}),
        ("update_records", {"table": "users", "data": {"plan": "free"}, "conditions": {"id": 1}}),
    ]
    return Session("sqlite", calls, reset, read, frozenset({"delete_records", "query"}))


def memory(path: Path) -> Session:
    def reset() -> None:
        path.write_text("")

    def read() -> Store:
        lines = path.read_text().splitlines() if path.exists() else []
        return {line: "" for line in lines if line.strip()}

    def entity(name: str, *observations: str) -> dict[str, Any]:
        return {"name": name, "entityType": "person", "observations": list(observations)}

    def knows(a: str, b: str) -> dict[str, Any]:
        return {"relations": [{"from": a, "to": b, "relationType": "knows"}]}

    calls: list[Call] = [
        ("create_entities", {"entities": [entity("ada", "likes tea"), entity("bob")]}),
        ("add_observations", {"observations": [{"entityName": "ada", "contents": ["writes code"]}]}),
        ("create_relations", knows("ada", "bob")),
        ("create_entities", {"entities": [entity("cy")]}),
        ("create_relations", knows("bob", "cy")),
        ("add_observations", {"observations": [{"entityName": "cy", "contents": ["plays chess"]}]}),
        ("delete_observations", {"deletions": [{"entityName": "ada", "observations": ["likes tea"]}]}),
        ("create_entities", {"entities": [entity("dee", "new here")]}),
        ("delete_relations", knows("ada", "bob")),
        ("add_observations", {"observations": [{"entityName": "dee", "contents": ["likes maps"]}]}),
    ]
    confirmed = frozenset({"delete_entities", "delete_observations", "delete_relations"})
    return Session("memory", calls, reset, read, confirmed)


def git(repo: Path) -> Session:
    def run(*args: str) -> str:
        return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout

    def reset() -> None:
        subprocess.run(["rm", "-rf", str(repo)], check=True)
        repo.mkdir(parents=True)
        run("init", "-q", "-b", "main")
        run("-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "--allow-empty", "-m", "first")
        for branch in ("feature/login", "feature/search", "fix/typo"):
            run("branch", branch)

    def read() -> Store:
        return {"HEAD": run("symbolic-ref", "HEAD").strip()} | {
            f"refs/{line.split()[1]}": line.split()[0] for line in run("show-ref").splitlines()
        }

    calls: list[Call] = [
        ("git_checkout", {"repo_path": str(repo), "branch_name": branch})
        for branch in ("feature/login", "feature/search", "main", "fix/typo", "feature/login", "main")
    ]
    return Session("git", calls, reset, read, frozenset())


def changed(before: Store, after: Store) -> set[str]:
    return {key for key in before.keys() | after.keys() if before.get(key) != after.get(key)}


async def aborted_after(gateway_url: str, session: Session, prefix: int, residue: Residue, kube: Any, ns: str) -> None:
    """The session's first `prefix` calls in one saga, then its abort, waited out; the store
    compared with its snapshot, each effect left named by the last call that changed it."""
    session.reset()
    snapshot = session.read()
    touched: dict[str, list[int]] = {}  # item -> the calls that changed it, in order
    steps: dict[int, str] = {}  # call -> its step, as the gateway named it
    made, handle, saga = 0, None, ""

    async def accept(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        return types.ElicitResult(action="accept")

    async with Client(gateway_url, elicitation_callback=accept) as agent:
        for index, (tool, args) in enumerate(session.calls[:prefix]):
            before = session.read()
            said = await agent.call_tool(tool, {**args, **({HANDLE: handle} if handle else {})})
            meta = said.meta or {}
            handle, steps[index] = str(meta.get("io.undolog/saga-handle") or handle), str(meta.get("io.undolog/step"))
            saga = str(meta.get("io.undolog/saga") or saga).rpartition("/")[2]
            difference = changed(before, session.read())
            made += bool(difference)
            for item in difference:
                touched.setdefault(item, []).append(index)
        if handle:
            await agent.call_tool("undolog_abort", {HANDLE: handle, "reason": f"residue after {prefix} calls"})
    await ended(kube, ns)
    entries = {e["spec"]["step"]: e["status"] for e in await kube.list("undoentries", ns) if e["spec"]["saga"] == saga}
    halted = next((f"{step} ({e.get('reason')})" for step, e in entries.items() if e.get("state") == "Failed"), None)
    left = [
        blamed(touched[item], session, [entries.get(steps[i]) for i in touched[item]])
        for item in changed(snapshot, session.read())
        if item in touched
    ]
    residue.runs += 1
    residue.made += made
    residue.left += len({index for index, _ in left})
    for index, kind in left:
        tool = session.calls[index][0]
        why = {"irreversible": "irreversible by design, confirmed by the user", "gap": "a gap: undone, still changed"}
        reason = why.get(kind, f"left for a person: the saga halted at {halted} before its undo")
        residue.leaving.setdefault(tool, set()).add(reason)


def blamed(calls: list[int], session: Session, entries: list[dict[str, Any] | None]) -> tuple[int, str]:
    """The call an item left changed is owed to: the last irreversible one that changed it (a
    person allowed it); else the oldest whose undo did not run; else the last (a gap)."""
    irreversible = [i for i in calls if session.calls[i][0] in session.confirmed]
    if irreversible:
        return irreversible[-1], "irreversible"
    pending = [i for i, entry in zip(calls, entries, strict=True) if (entry or {}).get("state") != "Compensated"]
    return (pending[0], "halted") if pending else (calls[-1], "gap")


async def ended(kube: Any, namespace: str) -> None:
    """Until every saga of the namespace has ended (the operator has undone it)."""

    async def phases() -> list[str]:
        return [str(s.get("status", {}).get("phase")) for s in await kube.list("sagas", namespace)]

    await eventually(phases, lambda seen: all(p in ENDED for p in seen), 120, "the aborted saga's end")


async def measure() -> dict[str, Any]:
    results: dict[str, Any] = {}
    async with bench_cluster() as bench:
        data = bench.work / "data"
        data.mkdir(exist_ok=True)
        sessions = [filesystem(data), sqlite(data), memory(bench.work / "memory.jsonl"), git(bench.work / "repo")]
        for session in sessions:
            session.reset()
        results = await residues(bench, sessions)
    return results


async def residues(bench: Bench, sessions: list[Session]) -> dict[str, Any]:
    namespace = await bench.namespace("residue")
    config = catalog(bench.work)
    config["upstreams"] |= git_config(bench.work / "repo")["upstreams"]
    config["tools"] |= git_config(bench.work / "repo")["tools"]
    operator = bench.operator(namespace)
    gateway = await serving_operator_calls(bench.kubeconfig, bench.kube, namespace, bench.work, config)
    results: dict[str, Any] = {}
    try:
        for session in sessions:
            residue = Residue()
            for prefix in range(1, len(session.calls) + 1):
                await aborted_after(gateway.url, session, prefix, residue, bench.kube, namespace)
            results[session.server] = {
                "calls": len(session.calls),
                "sessions": residue.runs,
                "effects_made": residue.made,
                "effects_undone": residue.made - residue.left,
                "effects_left": residue.left,
                "left_by": {tool: sorted(whys) for tool, whys in residue.leaving.items()},
            }
    finally:
        gateway.stop()
        operator.stop()
    return results


def main() -> None:
    results = asyncio.run(measure())
    print_table(
        ["server", "calls", "aborted sessions", "effects made", "undone", "left", "left by (why)"],
        [
            [
                server,
                r["calls"],
                r["sessions"],
                r["effects_made"],
                r["effects_undone"],
                r["effects_left"],
                "; ".join(f"{tool} ({', '.join(whys)})" for tool, whys in sorted(r["left_by"].items())) or "none",
            ]
            for server, r in results.items()
        ],
        ledger="each session aborted after every prefix of its calls; the store compared with its snapshot",
    )
    save("residue", results)


if __name__ == "__main__":
    main()
