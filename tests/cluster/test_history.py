"""History through one read model: `undolog history` and `undolog show` read finished sagas from
the archive (a real PostgreSQL server) once retention has deleted them, and only of namespaces
where the person may list sagas, as the API answers for them."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from devtools.postgres import LocalPostgres

from tests.cluster.test_cli import undolog
from tests.cluster.test_compensation import external_saga, register
from tests.cluster.test_retention import deleted
from tests.conftest import Cluster
from tests.support.manifests import call
from tests.support.namespaces import fresh_namespace
from tests.support.operator_process import OperatorProcess
from tests.support.participants import Participant, Received, Reply
from undolog.kube import Kube

pytestmark = pytest.mark.cluster


@pytest_asyncio.fixture
async def other_namespace(kube: Kube) -> AsyncIterator[str]:
    async with fresh_namespace(kube) as name:
        yield name


def may_list_sagas_in(cluster: Cluster, namespace: str, user: str) -> None:
    cluster.kubectl(
        "create", "role", "saga-reader", "-n", namespace, "--verb=get,list,watch", "--resource=sagas.undolog.io"
    )
    cluster.kubectl("create", "rolebinding", "saga-reader", "-n", namespace, "--role=saga-reader", f"--user={user}")


async def test_history_and_show_read_the_archive_and_another_tenants_history_is_refused(
    cluster: Cluster,
    kube: Kube,
    namespace: str,
    other_namespace: str,
    participant: Participant,
    tmp_path: Path,
    postgres: LocalPostgres,
) -> None:
    operator = OperatorProcess(
        cluster.kubeconfig,
        namespace,
        tmp_path,
        (f"--archive-dsn={postgres.dsn}", "--ttl-after-compensated=1s", f"--namespace={other_namespace}"),
    )
    operator.start()
    try:
        # Each saga's first attempt fails: one scripted 500 went to whichever namespace the
        # operator reached first, and left the other's history without a failed attempt.
        first_attempts: set[str] = set()

        def fail_first(request: Received) -> Reply:
            key = request.headers["idempotency-key"]
            if key in first_attempts:
                return Reply(200, {})
            first_attempts.add(key)
            return Reply(500, {"error": "ledger closed"})

        participant.handle("/refund", fail_first)
        for ns in (namespace, other_namespace):
            await register(kube, ns, participant, "refund")
            opened_for = f"system:serviceaccount:{ns}:agent"  # as the gateway records who opened it
            await external_saga(kube, ns, "order-7", [call("refund", amount=30)], orgId="acme", principal=opened_for)
            await kube.patch(
                "sagas",
                ns,
                "order-7",
                {
                    "spec": {"outcome": "Abort"},
                    "metadata": {"annotations": {"undolog.io/abort-reason": "card declined"}},
                },
            )
        for ns in (namespace, other_namespace):
            await deleted(kube, ns, "order-7", within=60)  # archived, then deleted by retention
    finally:
        operator.stop()
    env_dsn = f"--archive-dsn={postgres.dsn}"
    listed = undolog(cluster, "history", "-n", namespace, env_dsn)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split() == ["NAME", "PHASE", "STEPS", "UNDONE", "REASON", "FINISHED"]
    assert lines[1].split()[:5] == ["order-7", "Compensated", "1", "1", "Compensated"]
    found = undolog(cluster, "history", "-A", "--text", "card declined", "--function", "refund", "-o", "json", env_dsn)
    assert sorted(i["metadata"]["namespace"] for i in json.loads(found.stdout)["items"]) == sorted(
        [namespace, other_namespace]
    )
    assert undolog(cluster, "history", "-A", "--text", "no such words", env_dsn).stdout == ""
    whose = f"system:serviceaccount:{other_namespace}:agent"
    by_principal = undolog(cluster, "history", "-A", "--principal", whose, "-o", "json", env_dsn)
    assert [i["metadata"]["namespace"] for i in json.loads(by_principal.stdout)["items"]] == [other_namespace]

    shown = undolog(cluster, "show", "order-7", "-n", namespace, archive=postgres.dsn)
    assert shown.returncode == 0, shown.stderr
    assert "archived: gone from the cluster, read-only" in shown.stdout
    assert "HTTP 500" in shown.stdout  # the failed attempt, kept on the entry
    assert "Failed" in shown.stdout
    assert "card declined" in shown.stdout
    assert f"opened for: system:serviceaccount:{namespace}:agent" in shown.stdout  # who, kept in the archive
    other = undolog(cluster, "show", "order-7", "-n", other_namespace, archive=postgres.dsn)
    assert "HTTP 500" in other.stdout, other.stdout

    alice = f"alice-{uuid.uuid4().hex[:6]}"
    may_list_sagas_in(cluster, namespace, alice)
    as_alice = ("--as", alice, "--as-group", "system:authenticated")
    own = undolog(cluster, "history", "-n", namespace, env_dsn, *as_alice)
    assert own.returncode == 0, own.stderr
    assert "order-7" in own.stdout
    refused = undolog(cluster, "history", "-n", other_namespace, env_dsn, *as_alice)
    assert refused.returncode == 1
    assert f"you may not list sagas in namespace {other_namespace!r}" in refused.stderr
    everywhere = undolog(cluster, "history", "-A", "-o", "json", env_dsn, *as_alice)
    assert [i["metadata"]["namespace"] for i in json.loads(everywhere.stdout)["items"]] == [namespace]
    assert other_namespace in everywhere.stderr  # said to be left out
    hidden = undolog(cluster, "show", "order-7", "-n", other_namespace, *as_alice, archive=postgres.dsn)
    assert hidden.returncode == 1  # the API's own refusal; the archive is never read for them
    assert "forbidden" in hidden.stderr
    assert "archived" not in hidden.stdout
