"""The archive end to end: a real PostgreSQL server, the operator as a process. No finished saga
is deleted before its archive row is committed, whatever happens to PostgreSQL or the operator."""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import replace
from pathlib import Path

import httpx
import psycopg
import pytest
from devtools.postgres import LocalPostgres
from prometheus_client.parser import text_string_to_metric_families

from tests.cluster.test_cli import undolog
from tests.cluster.test_compensation import abort, external_saga, register
from tests.cluster.test_retention import deleted, no_entries_left
from tests.conftest import Cluster
from tests.support.manifests import call
from tests.support.operator_process import OperatorProcess
from tests.support.participants import Participant
from tests.support.waiting import eventually, saga_phase
from undolog.api import Saga, UndoEntry
from undolog.archive import ArchiveStore, archived_saga
from undolog.errors import NotFound
from undolog.kube import Kube

pytestmark = pytest.mark.cluster


def archiving(cluster: Cluster, namespace: str, tmp_path: Path, postgres: LocalPostgres, *args: str) -> OperatorProcess:
    return OperatorProcess(cluster.kubeconfig, namespace, tmp_path, (f"--archive-dsn={postgres.dsn}", *args))


def gauge(operator: OperatorProcess, name: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{operator.metrics_port}/metrics", timeout=5).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    raise AssertionError(f"no {name} in the operator's metrics")


def rows(postgres: LocalPostgres, sql: str, *params: object) -> list[tuple[object, ...]]:
    with psycopg.connect(postgres.dsn) as connection:
        return connection.execute(sql, params).fetchall()


@pytest.mark.fault  # a minute of outage: in make chaos and CI, not in make test
async def test_postgres_away_for_a_minute_while_100_sagas_finish_deletes_none_before_it_holds_them(
    cluster: Cluster, kube: Kube, namespace: str, participant: Participant, tmp_path: Path, postgres: LocalPostgres
) -> None:
    operator = archiving(cluster, namespace, tmp_path, postgres, "--ttl-after-compensated=1s")
    operator.start()
    try:
        await eventually(  # to_regclass: NULL, not an error, while the operator has not migrated yet
            lambda: asyncio.to_thread(rows, postgres, "SELECT to_regclass('undolog_schema_migrations') IS NOT NULL"),
            lambda found: bool(found[0][0]),
            30,
            "the archive's schema",
        )
        await register(kube, namespace, participant, "delete-user")
        postgres.stop()
        stopped = time.monotonic()
        names = [f"s-{i:03}" for i in range(100)]
        uids = {}
        for name in names:
            created, _ = await external_saga(kube, namespace, name, [call("delete-user")])
            uids[name] = created["metadata"]["uid"]
            await abort(kube, namespace, name)
        for name in names:
            await saga_phase(kube, namespace, name, "Compensated", within=120)
        await eventually(
            lambda: asyncio.to_thread(gauge, operator, "undolog_archive_backlog_sagas"),
            lambda v: v == 100,
            30,
            "a backlog of 100",
        )
        while time.monotonic() - stopped < 60:  # their TTL long past: every one stays while nothing holds it
            listed = await kube.list("sagas", namespace)
            assert len(listed) == 100, "a saga was deleted before the archive held it"
            await asyncio.sleep(1)
        assert gauge(operator, "undolog_archive_backlog_seconds") >= 30
        postgres.start()
        for name in names:
            await deleted(kube, namespace, name, within=120)
        archived = rows(postgres, "SELECT name, uid::text, phase FROM undolog_sagas")
        assert sorted(archived) == sorted((n, uids[n], "Compensated") for n in names)
        await eventually(
            lambda: asyncio.to_thread(gauge, operator, "undolog_archive_backlog_sagas"),
            lambda v: v == 0,
            30,
            "the backlog drained",
        )
        timeline = rows(postgres, "SELECT count(DISTINCT saga_uid) FROM undolog_events WHERE reason = 'Failed'")
        assert timeline == [(100,)]  # each saga's Failed Event, captured while PostgreSQL was away
    finally:
        operator.stop()


async def test_kill_9_after_the_archive_committed_archives_once_and_deletes_once(
    cluster: Cluster, kube: Kube, namespace: str, participant: Participant, tmp_path: Path, postgres: LocalPostgres
) -> None:
    operator = archiving(cluster, namespace, tmp_path, postgres, "--ttl-after-compensated=8s")  # archived first
    operator.start()
    await register(kube, namespace, participant, "delete-user")
    created, _ = await external_saga(kube, namespace, "once", [call("delete-user"), call("delete-user")])
    await abort(kube, namespace, "once")
    await saga_phase(kube, namespace, "once", "Compensated")
    uid = created["metadata"]["uid"]
    first = await eventually(
        lambda: asyncio.to_thread(
            rows, postgres, "SELECT xmin::text, archived_at FROM undolog_sagas WHERE uid = %s", uid
        ),
        bool,
        30,
        "the saga archived",
    )
    operator.kill()  # the archive's commit made, the deletion not (due 8 s after the saga finished)
    operator.start()
    try:
        await deleted(kube, namespace, "once")
        await no_entries_left(kube, namespace, "once")
        again = rows(postgres, "SELECT xmin::text, archived_at FROM undolog_sagas WHERE uid = %s", uid)
        assert again == first  # the same row, never written again (xmin: the transaction that wrote it)
        assert operator.log().count("deleted finished saga") == 1
        entries = rows(postgres, "SELECT entries FROM undolog_sagas WHERE uid = %s", uid)[0][0]
        assert [e["status"]["state"] for e in entries] == ["Compensated", "Compensated"]  # type: ignore[attr-defined]
    finally:
        operator.stop()


DOWN_SECONDS = 40  # PostgreSQL away this long at least: the pool's reconnection backs off meanwhile
SAGAS = int(os.environ.get("UNDOLOG_TEST_SAGAS", "60"))  # 1000 to measure a big backlog's drain


async def label_patches(kube: Kube, namespace: str, names: list[str], stop: asyncio.Event) -> int:
    """A concurrent writer (an agent or a person labelling sagas): every saga patched again and
    again, so the operator's conditional writes meet 409s. How many patches it made."""
    made = 0
    while not stop.is_set():
        for name in names:
            try:
                await kube.patch("sagas", namespace, name, {"metadata": {"labels": {"touched": str(made)}}})
                made += 1
            except NotFound:
                continue
    return made


async def finish_while_postgres_is_killed(
    kube: Kube, namespace: str, postgres: LocalPostgres, operator: OperatorProcess, sagas: int
) -> tuple[dict[str, str], float]:
    """`sagas` sagas of 3 entries, half committed and half aborted, finish while PostgreSQL is
    killed (SIGKILL) and a writer labels them; then PostgreSQL comes back. Their UIDs by name,
    and the seconds from PostgreSQL's return to an empty backlog."""
    names = [f"s-{i:04}" for i in range(sagas)]
    uids: dict[str, str] = {}
    postgres.kill()
    killed = time.monotonic()
    stop = asyncio.Event()
    writer = asyncio.create_task(label_patches(kube, namespace, names, stop))
    try:
        for name in names:
            created, _ = await external_saga(kube, namespace, name, [call("delete-user")] * 3)
            uids[name] = created["metadata"]["uid"]
        # All of them end at once: the watch falls behind the operator's own writes, as under load.
        await asyncio.gather(
            *(
                kube.patch("sagas", namespace, name, {"spec": {"outcome": "Commit" if i % 2 == 0 else "Abort"}})
                for i, name in enumerate(names)
            )
        )
        for i, name in enumerate(names):
            await saga_phase(kube, namespace, name, "Completed" if i % 2 == 0 else "Compensated", within=120)
        await eventually(
            lambda: asyncio.to_thread(gauge, operator, "undolog_archive_backlog_sagas"),
            lambda v: v == sagas,
            60,
            f"a backlog of {sagas}",
        )
        await asyncio.sleep(max(0.0, DOWN_SECONDS - (time.monotonic() - killed)))
    finally:
        stop.set()
        await writer
    assert len(await kube.list("sagas", namespace)) == sagas, "a saga was deleted while the archive was away"
    postgres.start()
    back = time.monotonic()
    await eventually(
        lambda: asyncio.to_thread(gauge, operator, "undolog_archive_backlog_sagas"),
        lambda v: v == 0,
        120,
        "the backlog drained",
    )
    return uids, time.monotonic() - back


def partial_rows(postgres: LocalPostgres, uids: dict[str, str], entries: int) -> list[str]:
    """The archived sagas whose row does not hold exactly their `entries` entries (or no row)."""
    found = rows(
        postgres,
        "SELECT name, jsonb_array_length(entries) FROM undolog_sagas WHERE uid = ANY(%s::uuid[])",
        list(uids.values()),
    )
    held: dict[object, object] = {name: count for name, count in found}
    return [f"{name}: {held.get(name, 'no row')}" for name in uids if held.get(name) != entries]


@pytest.mark.fault  # PostgreSQL away 40 s: in make chaos and CI, not in make test
async def test_sagas_finishing_while_postgres_is_killed_are_archived_whole_with_every_entry(
    cluster: Cluster, kube: Kube, namespace: str, participant: Participant, tmp_path: Path, postgres: LocalPostgres
) -> None:
    operator = archiving(
        cluster, namespace, tmp_path, postgres, "--ttl-after-completed=3s", "--ttl-after-compensated=3s"
    )
    operator.start()
    try:
        await eventually(
            lambda: asyncio.to_thread(rows, postgres, "SELECT to_regclass('undolog_schema_migrations') IS NOT NULL"),
            lambda found: bool(found[0][0]),
            30,
            "the archive's schema",
        )
        await register(kube, namespace, participant, "delete-user")
        uids, drained = await finish_while_postgres_is_killed(kube, namespace, postgres, operator, SAGAS)
        conflicts = operator.log().count("deciding again")
        print(f"\n{SAGAS} finished sagas drained {drained:.1f} s after PostgreSQL came back; {conflicts} conflicts")
        for name in uids:
            await deleted(kube, namespace, name, within=60)
        assert partial_rows(postgres, uids, 3) == []
    finally:
        operator.stop()


async def test_a_row_without_all_its_entries_is_refused_and_rows_an_earlier_release_wrote_so_are_mended(
    cluster: Cluster, kube: Kube, namespace: str, participant: Participant, tmp_path: Path, postgres: LocalPostgres
) -> None:
    """The archive refuses a row that lacks entries whatever writes it; a row an earlier release
    wrote so is archived again, whole, while its saga is in the cluster, and named (log, metric,
    `undolog archive check`) once it is gone."""
    operator = archiving(cluster, namespace, tmp_path, postgres)  # no TTL: every saga stays
    operator.start()
    try:
        await register(kube, namespace, participant, "delete-user")
        uids = {}
        for name in ("kept", "gone"):
            created, _ = await external_saga(kube, namespace, name, [call("delete-user")] * 2)
            uids[name] = created["metadata"]["uid"]
            await abort(kube, namespace, name)
            await saga_phase(kube, namespace, name, "Compensated")
        await eventually(
            lambda: asyncio.to_thread(partial_rows, postgres, uids, 2), lambda bad: bad == [], 30, "both archived"
        )
        store = ArchiveStore(postgres.dsn)
        await store.open()
        try:
            kept = Saga.model_validate(await kube.get("sagas", namespace, "kept"))
            entry = UndoEntry.model_validate(await kube.get("undoentries", namespace, "kept-2"))
            partial = replace(archived_saga(kept, [entry]), revision=10**12)  # newer than any: it would replace
            refused = await store.write([partial], [])
            assert [why for _, why in refused] == ["1 entries where its status.stackDepth says 2"]
        finally:
            await store.close()
        assert partial_rows(postgres, uids, 2) == []
        operator.stop()
        # As an earlier release left them: each row without its entries, not checked yet.
        rows(postgres, "UPDATE undolog_sagas SET entries = '[]', entries_revision = 0, whole = NULL RETURNING uid")
        await kube.delete("sagas", namespace, "gone")
        checked = undolog(cluster, "archive", "check", archive=postgres.dsn)
        assert checked.returncode == 1, checked.stderr
        outcomes = {line.split()[1]: line.split()[-2:] for line in checked.stdout.splitlines()[1:]}
        assert outcomes == {"kept": ["archived", "again"], "gone": ["saga", "gone"]}, checked.stdout
        assert "2 rows not known whole checked: 0 whole, 1 archived again, 1 whose saga is gone" in checked.stderr
        assert partial_rows(postgres, uids, 2) == ["gone: 0"]
        operator.start()  # at start, the same check: the gone saga's row named, and counted
        await eventually(
            lambda: asyncio.to_thread(gauge, operator, "undolog_archive_partial_rows"), lambda v: v == 1, 30, "1 row"
        )
        assert f"the row of saga {namespace}/gone (uid {uids['gone']}) lacks entries" in operator.log()
    finally:
        operator.stop()
