"""The triage CLI as a subprocess against the real cluster: output and exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.test_compensation import abort, external_saga, register
from tests.conftest import BIN, Cluster
from tests.support.identities import service_account_kubeconfig
from tests.support.manifests import call
from tests.support.operator_process import OperatorProcess
from tests.support.participants import Participant, Reply
from tests.support.waiting import saga_phase
from undolog.kube import Kube

pytestmark = pytest.mark.cluster


def undolog(cluster: Cluster, *args: str, kubeconfig: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**cluster.env, "KUBECONFIG": str(kubeconfig or cluster.kubeconfig), "COLUMNS": "250"}
    return subprocess.run(
        [sys.executable, "-m", "undolog.cli", *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )


async def halted_saga(kube: Kube, namespace: str, participant: Participant, name: str = "stuck") -> dict[str, Any]:
    participant.script("/revoke", Reply(400, {"error": "no such grant"}))
    await register(kube, namespace, participant, "delete-user", "revoke", "unsend")
    await external_saga(kube, namespace, name, [call("delete-user"), call("revoke"), call("unsend")], orgId="acme")
    await abort(kube, namespace, name)
    return await saga_phase(kube, namespace, name, "Halted")


async def test_list_puts_halted_first_and_filters(
    kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess, cluster: Cluster
) -> None:
    await halted_saga(kube, namespace, participant)
    await external_saga(kube, namespace, "fine", [call("unsend")])
    await saga_phase(kube, namespace, "fine", "Active")
    listed = undolog(cluster, "list", "-n", namespace)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split() == ["NAMESPACE", "NAME", "PHASE", "STEPS", "UNDONE", "REASON", "AGE"]
    assert lines[1].split()[:6] == [namespace, "stuck", "Halted", "3", "1", "CompensationFailed"]
    assert lines[2].split()[:5] == [namespace, "fine", "Active", "1", "0"]
    assert "\x1b[" not in listed.stdout  # no colour when not a terminal

    halted = json.loads(undolog(cluster, "list", "-n", namespace, "--phase", "Halted", "-o", "json").stdout)
    assert [item["metadata"]["name"] for item in halted["items"]] == ["stuck"]
    by_org = undolog(cluster, "list", "--org", "acme", "-o", "yaml")
    assert "name: stuck" in by_org.stdout
    assert "name: fine" not in by_org.stdout
    everywhere = undolog(cluster, "list")
    assert "stuck" in everywhere.stdout


async def test_show_and_plan_of_a_halted_saga(
    kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess, cluster: Cluster
) -> None:
    await halted_saga(kube, namespace, participant)
    shown = undolog(cluster, "show", "stuck", "-n", namespace)
    assert shown.returncode == 0, shown.stderr
    assert f"{namespace}/stuck  Halted  CompensationFailed" in shown.stdout
    stack = [line.split() for line in shown.stdout.splitlines() if line.split()[:1] in (["3"], ["2"], ["1"])]
    assert [row[:6] for row in stack[:3]] == [
        ["3", "step3", "unsend", "v1", "Committed", "Compensated"],
        ["2", "step2", "revoke", "v1", "Committed", "Failed"],
        ["1", "step1", "delete-user", "v1", "Committed", "Pending"],
    ]
    assert "HTTP 400" in shown.stdout
    for reason in ("Active", "Failed", "Compensating", "EntryCompensated", "CompensationFailed", "Halted"):
        assert reason in shown.stdout

    planned = undolog(cluster, "plan", "stuck", "-n", namespace)
    assert planned.returncode == 0, planned.stderr
    rows = [line.split() for line in planned.stdout.splitlines() if line.split()[:1] in (["1"], ["2"])]
    assert [row[:5] for row in rows] == [
        ["1", "2", "step2", "Failed", "revoke"],
        ["2", "1", "step1", "Pending", "delete-user"],
    ]
    assert participant.url("/revoke") in planned.stdout
    assert len(participant.received("/revoke")) == 1  # plan did not call anything


async def test_retry_skip_abort_wait_and_their_refusals(
    kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess, cluster: Cluster
) -> None:
    await halted_saga(kube, namespace, participant)
    wrong = undolog(cluster, "skip", "stuck", "7", "--reason", "x", "-n", namespace)
    assert wrong.returncode == 1
    assert "saga 'stuck' has no entry at position 7 (it has [1, 2, 3])" in wrong.stderr
    done_entry = undolog(cluster, "skip", "stuck", "3", "--reason", "x", "-n", namespace)
    assert done_entry.returncode == 1
    # The operator's own rule, in its own words (decisions.resolutions).
    assert (
        "skip of stuck-3 refused: only a Pending or Failed entry of a Halted saga can be skipped "
        "(saga Halted, entry Compensated)" in done_entry.stderr
    )

    skipped = undolog(cluster, "skip", "stuck", "2", "--reason", "revoked by hand", "-n", namespace)
    assert skipped.returncode == 0, skipped.stderr
    waited = undolog(cluster, "wait", "stuck", "--for", "Compensated", "--timeout", "30", "-n", namespace)
    assert waited.returncode == 0, waited.stderr
    assert f"{namespace}/stuck is Compensated" in waited.stdout
    entry = await kube.get("undoentries", namespace, "stuck-2")
    assert entry["status"]["skipReason"].startswith("revoked by hand (by ")  # who and when recorded

    again = undolog(cluster, "retry", "stuck", "-n", namespace)
    assert again.returncode == 1
    assert "retry refused: saga stuck is Compensated, not Halted" in again.stderr
    late = undolog(cluster, "abort", "stuck", "--reason", "x", "-n", namespace)
    assert late.returncode == 1
    assert "abort refused: saga stuck is Compensated; only an Active saga can be aborted" in late.stderr

    await external_saga(kube, namespace, "live", [call("unsend")])
    await saga_phase(kube, namespace, "live", "Active")
    never = undolog(cluster, "wait", "live", "--for", "Compensated", "--timeout", "1", "-n", namespace)
    assert never.returncode == 1
    assert "saga 'live' is Active, not Compensated, after 1 s" in never.stderr
    aborted = undolog(cluster, "abort", "live", "--reason", "customer cancelled", "-n", namespace)
    assert aborted.returncode == 0, aborted.stderr
    done = await saga_phase(kube, namespace, "live", "Compensated")
    assert "customer cancelled (by " in done["status"]["conditions"][0]["message"]


async def test_retry_of_a_halted_saga(
    kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess, cluster: Cluster
) -> None:
    await halted_saga(kube, namespace, participant)
    retried = undolog(cluster, "retry", "stuck", "--reason", "grant restored", "-n", namespace)
    assert retried.returncode == 0, retried.stderr
    done = await saga_phase(kube, namespace, "stuck", "Compensated")
    assert "grant restored (by " in done["status"]["conditions"][2]["message"]


def test_missing_saga_and_rbac_refusal_are_clear(cluster: Cluster, namespace: str, kube: Kube, tmp_path: Path) -> None:
    missing = undolog(cluster, "show", "nope", "-n", namespace)
    assert missing.returncode == 1
    assert f"saga 'nope' not found in namespace '{namespace}'" in missing.stderr
    assert "Traceback" not in missing.stderr
    import asyncio

    nobody = asyncio.get_event_loop().run_until_complete(
        service_account_kubeconfig(kube, cluster.kubeconfig, namespace, "nobody", tmp_path / "nobody.kubeconfig")
    )
    refused = undolog(cluster, "list", "-n", namespace, kubeconfig=nobody)
    assert refused.returncode == 1
    assert (
        f'forbidden: sagas.undolog.io is forbidden: User "system:serviceaccount:{namespace}:nobody"' in refused.stderr
    )


def test_installed_as_a_kubectl_plugin(cluster: Cluster, namespace: str) -> None:
    plugin_dir = Path(sys.executable).parent
    assert (plugin_dir / "kubectl-undolog").exists()
    env = {**cluster.env, "PATH": f"{plugin_dir}:{BIN}:{os.environ['PATH']}"}
    result = subprocess.run(
        [str(BIN / "kubectl"), "undolog", "list", "-n", namespace], capture_output=True, text=True, env=env, check=False
    )
    assert result.returncode == 0, result.stderr
    assert f"no sagas found in namespace {namespace}" in result.stderr
