"""The archive end to end: a real PostgreSQL server, the operator as a process. No finished saga
is deleted before its archive row is committed, whatever happens to PostgreSQL or the operator."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import psycopg
import pytest
from devtools.postgres import LocalPostgres
from prometheus_client.parser import text_string_to_metric_families

from tests.cluster.test_compensation import abort, external_saga, register
from tests.cluster.test_retention import deleted, no_entries_left
from tests.conftest import Cluster
from tests.support.manifests import call
from tests.support.operator_process import OperatorProcess
from tests.support.participants import Participant
from tests.support.waiting import eventually, saga_phase
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
    operator = archiving(cluster, namespace, tmp_path, postgres)  # no TTL yet: archived, not deleted
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
    operator.kill()  # the archive's commit made, the deletion not
    operator.extra_args = (*operator.extra_args, "--ttl-after-compensated=1s")  # due at once now
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
