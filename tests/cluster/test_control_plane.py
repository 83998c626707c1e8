"""The local control plane starts from the built binaries, is reused, and stops without leftovers."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from devtools.control_plane import LocalControlPlane
from devtools.control_plane.local import PROCESSES

from tests.conftest import BIN, REPO

pytestmark = pytest.mark.skipif(bool(os.environ.get("KUBECONFIG")), reason="tests the local control plane")


def undolog_cluster(*args: str, state_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "devtools.cluster",
            *args,
            "--state-dir",
            str(state_dir),
            "--bin-dir",
            str(BIN),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=REPO,
        check=False,
    )


def test_up_reuse_down_leaves_no_process(tmp_path: Path) -> None:
    started = undolog_cluster("up", state_dir=tmp_path)
    assert started.returncode == 0, started.stderr
    assert f"export KUBECONFIG={tmp_path / 'kubeconfig'}" in started.stdout
    print(started.stderr.strip())  # "control plane ready in N s" for the note
    pids = LocalControlPlane(tmp_path, BIN).running_pids()
    assert sorted(pids) == sorted(PROCESSES)

    again = undolog_cluster("up", state_dir=tmp_path)
    assert again.returncode == 0
    assert "already running" in again.stderr
    assert LocalControlPlane(tmp_path, BIN).running_pids() == pids

    namespaces = subprocess.run(
        [
            str(BIN / "kubectl"),
            f"--kubeconfig={tmp_path / 'kubeconfig'}",
            "get",
            "namespace",
            "default",
            "-o",
            "name",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert namespaces.stdout.strip() == "namespace/default"

    stopped = undolog_cluster("down", state_dir=tmp_path)
    assert stopped.returncode == 0, stopped.stderr
    assert "stopped 3 processes" in stopped.stderr
    assert all(not Path(f"/proc/{pid}").exists() or _zombie(pid) for pid in pids.values())
    assert LocalControlPlane(tmp_path, BIN).running_pids() == {}


def _zombie(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"


def test_missing_binaries_are_named(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "devtools.cluster",
            "up",
            "--state-dir",
            str(tmp_path),
            "--bin-dir",
            "/nonexistent",
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
    )
    assert result.returncode == 1
    assert "etcd, kube-apiserver, kube-controller-manager not found in /nonexistent: run `make tools` first" in (
        result.stderr
    )


def test_up_after_the_apiserver_died_keeps_the_ledger(tmp_path: Path) -> None:
    """`cluster up` restarts what is down on the data it has; only `reset` deletes it."""
    started = undolog_cluster("up", state_dir=tmp_path)
    assert started.returncode == 0, started.stderr
    kubectl = [str(BIN / "kubectl"), f"--kubeconfig={tmp_path / 'kubeconfig'}"]
    try:
        subprocess.run([*kubectl, "create", "namespace", "keep-me"], check=True, capture_output=True)
        pids = LocalControlPlane(tmp_path, BIN).running_pids()
        os.kill(pids["kube-apiserver"], 9)
        again = undolog_cluster("up", state_dir=tmp_path)
        assert again.returncode == 0, again.stderr
        assert "restarted kube-apiserver" in again.stderr
        after = LocalControlPlane(tmp_path, BIN).running_pids()
        assert after["etcd"] == pids["etcd"]  # what was up stayed up
        found = subprocess.run([*kubectl, "get", "namespace", "keep-me", "-o", "name"], capture_output=True, text=True)
        assert found.stdout.strip() == "namespace/keep-me", found.stderr
    finally:
        undolog_cluster("down", state_dir=tmp_path)


def test_down_then_up_starts_on_the_data_it_had_on_new_ports_if_the_old_are_taken(tmp_path: Path) -> None:
    """`cluster down` stops; `cluster up` starts again on the same etcd data and certificates
    (the same ports, or new ones with the kubeconfig rewritten when another process took them)."""
    kubeconfig = tmp_path / "kubeconfig"
    kubectl = [str(BIN / "kubectl"), f"--kubeconfig={kubeconfig}"]
    try:
        assert undolog_cluster("up", state_dir=tmp_path).returncode == 0
        subprocess.run([*kubectl, "create", "namespace", "keep-me"], check=True, capture_output=True)
        ca = (tmp_path / "pki" / "serving-ca.crt").read_bytes()
        server = LocalControlPlane(tmp_path, BIN).up().server
        for taken in (False, True):
            stopped = undolog_cluster("down", state_dir=tmp_path)
            assert stopped.returncode == 0, stopped.stderr
            with contextlib.ExitStack() as holding:
                if taken:  # another process listens on the apiserver's port meanwhile
                    port = int(server.rsplit(":", 1)[1])
                    sock = holding.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
                    sock.bind(("127.0.0.1", port))
                    sock.listen()
                again = undolog_cluster("up", state_dir=tmp_path)
                assert again.returncode == 0, again.stderr
                found = subprocess.run(
                    [*kubectl, "get", "namespace", "keep-me", "-o", "name"], capture_output=True, text=True
                )
                assert found.stdout.strip() == "namespace/keep-me", found.stderr
            assert (tmp_path / "pki" / "serving-ca.crt").read_bytes() == ca
            moved = LocalControlPlane(tmp_path, BIN).up().server
            assert (moved != server) == taken, (moved, server)
    finally:
        undolog_cluster("down", state_dir=tmp_path)
