"""The participant kits (undolog.participant; participant-kit/ for Node) in real participant
processes: the contract kit, signatures and fences included, passes against each (Python on
SQLite and PostgreSQL, under aiohttp and ASGI; TypeScript on PostgreSQL) and names each rule a
participant without the barrier breaks; and
a participant killed (SIGKILL) between its effect and its answer, again and again, leaves every
effect made once: the effect and the barrier's record commit together or not at all."""

from __future__ import annotations

import asyncio
import base64
import os
import shutil
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from devtools.control_plane.local import free_port
from devtools.postgres import PASSWORD, LocalPostgres

from tests.conftest import REPO
from tests.support import kit_load
from undolog.calls import protocol
from undolog.conventions import LATE_FORWARD_STATUS, compensation_key, forward_key
from undolog.testing import Participant, problems

pytestmark = pytest.mark.cluster  # a real PostgreSQL server (make test installs it)
CRASHES = 50
KILLS = 20


@contextmanager
def kit_participant(database: list[str], *extra: str) -> Iterator[str]:
    with kit_participant_process(database, *extra) as (base, _):
        yield base


@contextmanager
def kit_participant_process(database: list[str], *extra: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A participant of the Python kit, serving, and its process."""
    port = free_port()
    command = [sys.executable, "-m", "tests.support.kit_participant", "--port", str(port), *database, *extra]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.post(f"{base}/charge", timeout=1, content=b"{}")
            break
        except httpx.HTTPError:
            if process.poll() is not None or time.monotonic() > deadline:
                said = process.stderr.read() if process.stderr else b""
                raise AssertionError(f"the kit participant did not start: {said!r}") from None
            time.sleep(0.1)
    try:
        yield base, process
    finally:
        process.kill()
        process.wait(10)


def charges(database: list[str]) -> dict[str, int]:
    kind, where = database
    if kind == "--sqlite":
        with sqlite3.connect(where) as connection:
            return dict(connection.execute("SELECT key, amount FROM charges").fetchall())
    with psycopg.connect(where) as connection:
        return dict(connection.execute("SELECT key, amount FROM charges").fetchall())


def charged_under(database: list[str], key: str) -> bool:
    """Whether the forward call under `key` made a charge (the barrier's record names it)."""
    kind, where = database
    query = "SELECT count(*) FROM undolog_barrier WHERE key = {} AND kind = 'forward'"
    if kind == "--sqlite":
        with sqlite3.connect(where) as connection:
            return bool(connection.execute(query.format("?"), (key,)).fetchone()[0])
    with psycopg.connect(where) as connection:
        found = connection.execute(query.format("%s"), (key,)).fetchone()
        return bool(found and found[0])


@pytest.mark.parametrize("web", ["aiohttp", "asgi"])
@pytest.mark.parametrize("store", ["sqlite", "postgres"])
def test_a_kit_participant_keeps_the_whole_contract(
    store: str, web: str, tmp_path: Path, postgres: LocalPostgres
) -> None:
    database = ["--sqlite", str(tmp_path / "shop.db")] if store == "sqlite" else ["--postgres", postgres.dsn]
    with kit_participant(database, "--web", web, "--secret", SECRET) as base:
        found = problems(contract(base, lambda key: charged_under(database, key)))
    assert found == []
    assert list(charges(database).values()) == []  # charged once, refunded once


def send(base: str, path: str, key: str, body: dict[str, object], forward: str | None = None) -> httpx.Response:
    headers = protocol.headers(
        idempotency_key=key, saga="kit/crash", step="charge", org=None, attempt=1, forward=forward
    )
    return httpx.post(f"{base}{path}", json=body, headers=headers, timeout=10)


@pytest.mark.parametrize("kit", ["python-sqlite", "python-postgres", "typescript-postgres"])
async def test_many_keys_at_once_each_effect_awaiting_an_outside_call(
    kit: str, tmp_path: Path, postgres: LocalPostgres
) -> None:
    """Ten keys at once, each charge awaiting 0.2 s (an outside call) in its transaction, each
    compensation sent 50 ms after its forward call: every call answered, every charge made is
    refunded, none left; then the same ten keys' forward calls sent three times each at once
    (no compensation): one charge per key, the same answer to each repeat."""
    database = ["--sqlite", str(tmp_path / "shop.db")] if kit == "python-sqlite" else ["--postgres", postgres.dsn]
    with kit_participant_of(kit, database, postgres) as base:
        load = await kit_load.keys_at_once(base, 10, compensate_after=0.05, effect_seconds=0.2)
        repeated = await kit_load.keys_at_once(base, 10, compensate_after=None, repeats=3, effect_seconds=0.2)
    print(f"\n{kit}: 10 keys in {load.seconds:.2f} s, slowest call {load.slowest:.2f} s; {load.statuses}")
    assert load.errors == []
    assert set(load.statuses["forward"]) <= {200, LATE_FORWARD_STATUS}
    assert load.statuses["compensation"] == [200] * 10
    assert repeated.errors == []
    assert repeated.statuses["forward"] == [200] * 30
    assert len(charges(database)) == 10  # the repeated keys' charges, one each; every compensated one undone


@contextmanager
def kit_participant_of(kit: str, database: list[str], postgres: LocalPostgres) -> Iterator[str]:
    with kit_process_of(kit, database, postgres) as (base, _):
        yield base


@contextmanager
def kit_process_of(kit: str, database: list[str], postgres: LocalPostgres) -> Iterator[tuple[str, Any]]:
    """A participant of the kit (Python's on `database`, or TypeScript's example on
    PostgreSQL), serving, and its process."""
    if kit.startswith("python"):
        with kit_participant_process(database) as running:
            yield running
        return
    url = f"postgresql://undolog:{PASSWORD}@127.0.0.1:{postgres.port}/undolog"
    with node_participant_process("example/example.mjs", url) as running:
        yield running


@pytest.mark.fault  # 120 participant processes: make chaos and CI, not make test
@pytest.mark.parametrize("kit", ["python-sqlite", "python-postgres", "typescript-postgres"])
async def test_killed_under_calls_at_once_every_effect_once_and_every_compensation_once(
    kit: str, tmp_path: Path, postgres: LocalPostgres
) -> None:
    """KILLS times: ten keys at once (each charge awaiting 0.2 s, each compensation 50 ms after
    its forward call), the participant killed (SIGKILL) at the first answer, started again, and
    every call that got no answer sent again under its key, as the operator retries: every
    compensation answered once, and no charge left (one made twice, or one whose undo was
    lost, would be)."""
    database = ["--sqlite", str(tmp_path / "shop.db")] if kit == "python-sqlite" else ["--postgres", postgres.dsn]
    cut = 0
    for _ in range(KILLS):
        plan, load = kit_load.planned(10, effect_seconds=0.2), kit_load.Load()
        with kit_process_of(kit, database, postgres) as (base, process):
            running = asyncio.create_task(kit_load.sent(base, plan, load))
            async with asyncio.timeout(30):
                await load.answered.wait()
            process.kill()
            await running
        with kit_participant_of(kit, database, postgres) as base:
            again = await kit_load.sent_again(base, load.unanswered)
        assert again.errors == []
        assert set(load.statuses["forward"] + again.statuses["forward"]) <= {200, LATE_FORWARD_STATUS}
        assert sorted(load.statuses["compensation"] + again.statuses["compensation"]) == [200] * 10
        assert charges(database) == {}
        assert compensations_recorded(database, [calls.compensation or "" for calls in plan]) == 10
        cut += len(load.unanswered)
    print(f"\n{kit}: {KILLS} kills under 10 keys at once, {cut} calls cut off and sent again; no charge left")
    assert cut > 0  # the kills did land in the middle of calls


def compensations_recorded(database: list[str], keys: list[str]) -> int:
    kind, where = database
    query = "SELECT count(*) FROM undolog_barrier WHERE kind = 'compensation' AND key = {}"
    total = 0
    for key in keys:
        if kind == "--sqlite":
            with sqlite3.connect(where) as connection:
                total += connection.execute(query.format("?"), (key,)).fetchone()[0]
        else:
            with psycopg.connect(where) as connection:
                found = connection.execute(query.format("%s"), (key,)).fetchone()
                total += found[0] if found else 0
    return total


@pytest.mark.fault  # 100 participant processes: make chaos and CI, not make test
@pytest.mark.parametrize("store", ["sqlite", "postgres"])
def test_killed_between_its_effect_and_its_answer_every_effect_is_made_once(
    store: str, tmp_path: Path, postgres: LocalPostgres
) -> None:
    """Each charge's first try kills the participant after the charge is written and before the
    transaction commits; the operator's retry under the same key, to the restarted participant,
    charges once; the refund then undoes it once."""
    database = ["--sqlite", str(tmp_path / "shop.db")] if store == "sqlite" else ["--postgres", postgres.dsn]
    crash = tmp_path / "crash"
    made = []
    for i in range(CRASHES):
        key = forward_key(str(uuid.uuid4()), "charge")
        crash.write_text("1")
        with kit_participant(database, "--crash-between", str(crash)) as base, pytest.raises(httpx.HTTPError):
            send(base, "/charge", key, {"order": f"o-{i}", "amount": 1})
        with kit_participant(database) as base:
            first = send(base, "/charge", key, {"order": f"o-{i}", "amount": 1})
            again = send(base, "/charge", key, {"order": f"o-{i}", "amount": 1})
            assert first.status_code == 200
            assert again.json() == first.json()  # the first answer, nothing charged twice
            undo = compensation_key(str(uuid.uuid4()))
            assert send(base, "/refund", undo, {}, forward=key).status_code == 200
            assert send(base, "/refund", undo, {}, forward=key).status_code == 200
        made.append(first.json()["charge"])
    print(f"\n{CRASHES} kills between the effect and its answer ({store}): {len(set(made))} charges, each once")
    assert len(set(made)) == CRASHES
    assert charges(database) == {}  # every charge refunded exactly once, none left from a killed try


KIT = REPO / "participant-kit"
SECRET = "whsec_" + base64.b64encode(b"the-contract-kit-signing-key-32b").decode()


@contextmanager
def node_participant(script: str, url: str, *extra: str) -> Iterator[str]:
    with node_participant_process(script, url, *extra) as (base, _):
        yield base


@contextmanager
def node_participant_process(script: str, url: str, *extra: str) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """A participant of participant-kit/ (built by `make participant-kit`) run by Node, and its process."""
    node = shutil.which("node")
    assert node is not None, "Node is not installed"
    port = free_port()
    process = subprocess.Popen([node, script, str(port), url, *extra], cwd=KIT, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        assert process.stdout.readline().startswith("listening"), f"{script} did not start"
        yield f"http://127.0.0.1:{port}", process
    finally:
        process.kill()
        process.wait(10)


def contract(base: str, applied: Callable[[str], bool] | None) -> Participant:
    """The whole contract, with signatures and fences."""
    return Participant(
        compensation_url=f"{base}/refund",
        forward_url=f"{base}/charge",
        forward_args={"order": "o-1", "amount": 10},
        slow_forward_args={"order": "o-1", "amount": 10, "seconds": 0.2},  # as an outside call in the charge
        timeout_seconds=5,
        applied=applied,
        signing_secret=SECRET,
        fences=True,
    )


def test_the_typescript_kit_keeps_the_same_contract(postgres: LocalPostgres) -> None:
    """The TypeScript kit: its own tests with Node's test runner on this PostgreSQL, then the
    contract kit against its example participant."""
    url = f"postgresql://undolog:{PASSWORD}@127.0.0.1:{postgres.port}/undolog"
    ran = subprocess.run(
        ["node", "--test", "test/barrier.test.mjs"],
        cwd=KIT,
        env={**os.environ, "UNDOLOG_TEST_POSTGRES": url},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    print(f"\n{ran.stdout.strip().splitlines()[-8:]}")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    database = ["--postgres", postgres.dsn]
    with node_participant("example/example.mjs", url, SECRET) as base:
        found = problems(contract(base, lambda key: charged_under(database, key)))
    assert found == []
    assert charges(database) == {}  # charged once, refunded once


@pytest.mark.parametrize("language", ["python", "typescript"])
def test_a_participant_without_the_barrier_is_named_for_each_rule_it_breaks(
    language: str, postgres: LocalPostgres
) -> None:
    """The same participants with the Idempotency-Key's answers kept by hand and nothing else."""
    url = f"postgresql://undolog:{PASSWORD}@127.0.0.1:{postgres.port}/undolog"
    with (
        kit_participant(["--postgres", postgres.dsn], "--naive")
        if language == "python"
        else node_participant("test/keys-only.mjs", url)
    ) as base:
        found = problems(contract(base, None))
    print("\n" + "\n".join(found))
    named = [
        "arriving after its compensation",
        "a changed body was accepted",
        "another key was accepted",
        "10 minutes old was accepted",
        "an older fence must be refused 409",
    ]
    assert [any(rule in problem for problem in found) for rule in named] == [True] * len(named), found
