"""`undolog verify` against the example services: every failure point of the onboarding saga
undone in order; a deliberately broken compensation caught."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.test_cli import undolog
from tests.conftest import REPO, Cluster
from tests.support.operator_process import OperatorProcess

pytestmark = pytest.mark.cluster
ONBOARDING = REPO / "examples" / "onboarding"


@pytest.fixture
def services() -> Iterator[None]:
    """The onboarding services on the ports examples/onboarding/webhooks.yaml names."""
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "examples.onboarding.services",
            "--identity-port=8101",
            "--authorization-port=8102",
            "--email-port=8103",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "services ready"
    yield
    process.terminate()
    process.wait(timeout=10)


def test_every_failure_point_of_the_onboarding_saga_is_undone_in_order(
    cluster: Cluster, namespace: str, operator: OperatorProcess, services: None
) -> None:
    done = undolog(cluster, "verify", str(ONBOARDING / "saga.yaml"), str(ONBOARDING / "webhooks.yaml"), "-n", namespace)
    print("\n" + done.stdout + done.stderr)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert "after step 2 (assign_permissions)" in done.stdout
    row = next(line for line in lines if line.startswith("after step 3 (send_welcome_email)"))
    assert "send_welcome_email, assign_permissions, create_user" in row
    row = next(line for line in lines if line.startswith("in the compensation of create_user"))
    assert "Compensated" in row
    assert "all 6 failure points undone in order" in done.stdout


def test_a_broken_compensation_is_caught(
    cluster: Cluster, namespace: str, operator: OperatorProcess, services: None, tmp_path: Path
) -> None:
    broken = tmp_path / "webhooks.yaml"
    broken.write_text((ONBOARDING / "webhooks.yaml").read_text().replace("/permissions/revoke", "/permissions/revok"))
    done = undolog(cluster, "verify", str(ONBOARDING / "saga.yaml"), str(broken), "-n", namespace)
    print("\n" + done.stdout + done.stderr)
    assert done.returncode == 1
    row = next(line for line in done.stdout.splitlines() if line.startswith("after step 2 (assign_permissions)"))
    assert "Halted" in row
    assert "assign_permissions is Failed, not undone" in row
    assert "failure points leave a gap" in done.stderr
    first = next(line for line in done.stdout.splitlines() if line.startswith("after step 1 (create_user)"))
    assert first.rstrip().endswith("none")  # what does not need the broken compensation still passes
