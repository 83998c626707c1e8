"""The operator as a real subprocess (`undolog operator`), as in production: killable with -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

from devtools.control_plane.local import free_ports

from tests.support.waiting import until_healthy

BIND_TRIES = 3


def skewed_clock(offset: str) -> dict[str, str]:
    """The environment that sets a process's clock off by `offset` (libfaketime's, e.g. "+20m"),
    preloaded into the process itself: the `faketime` command runs it as a child, which a
    signal to the command does not stop (every test operator so started outlived its test)."""
    found = sorted(Path("/usr/lib").glob("*/faketime/libfaketime.so.1"))
    if not found:
        raise RuntimeError("libfaketime is not installed (make test installs Debian's faketime)")
    return {"LD_PRELOAD": str(found[0]), "FAKETIME": offset}


class OperatorProcess:
    def __init__(
        self,
        kubeconfig: Path,
        namespace: str,
        log_dir: Path,
        extra_args: tuple[str, ...] = ("--verbose",),
        *,
        lease_namespace: str | None = None,
        lease_seconds: int = 4,
        allow_loopback: bool = True,
        clock_off_by: str | None = None,
        environment: dict[str, str] | None = None,
    ) -> None:
        """Watching `namespace`, standing for a Lease in `lease_namespace` (the watched one by
        default, so tests do not wait on each other's Leases); participants on loopback are
        allowed unless `allow_loopback` is False (the egress tests). `clock_off_by`: its clock
        set off by that much (libfaketime's offset, e.g. "+20m"), as on a node with a bad clock.
        `environment`: more variables (PYTHONPATH: an earlier release's operator)."""
        self.kubeconfig, self.namespace, self.log_dir = kubeconfig, namespace, log_dir
        self.environment = {**(skewed_clock(clock_off_by) if clock_off_by else {}), **(environment or {})}
        # One name on the Lease across this operator's restarts, as a pod's name survives its
        # container's: a restart after kill -9 takes the Lease back at once.
        self.identity = f"test-{uuid.uuid4().hex[:8]}"
        self.extra_args = (
            f"--identity={self.identity}",
            f"--leader-election-namespace={lease_namespace or namespace}",
            f"--lease-seconds={lease_seconds}",
            *(("--egress-allow-loopback",) if allow_loopback else ()),
            *extra_args,
        )
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.metrics_port = 0

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"operator-{self.namespace}-{self.identity}-{self.starts}.log"

    def start(self, timeout: float = 60.0) -> None:
        """Start it and wait until it is healthy. Ports picked free here can be taken by another
        process before the operator binds them (seen in make test, another worker's server on
        the liveness port): then it is started again on others, up to BIND_TRIES times."""
        for tries_left in range(BIND_TRIES - 1, -1, -1):
            try:
                return self._start(timeout)
            except AssertionError:
                if tries_left == 0 or self.process is None or "address already in use" not in self.log():
                    raise

    def _start(self, timeout: float) -> None:
        self.starts += 1
        liveness, self.metrics_port = free_ports(2)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "undolog.cli",
                    "operator",
                    "--namespace",
                    self.namespace,
                    "--liveness-port",
                    str(liveness),
                    "--metrics-port",
                    str(self.metrics_port),
                    *self.extra_args,
                ],
                env={**os.environ, "KUBECONFIG": str(self.kubeconfig), "PYTHONUNBUFFERED": "1", **self.environment},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        until_healthy(f"http://127.0.0.1:{liveness}/healthz", self.process, self.log, timeout, "the operator")

    def kill(self) -> None:
        """kill -9: no cleanup, no goodbye, exactly like a crashed pod."""
        if self.process and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()

    def peak_rss_mib(self) -> float:
        """The process's peak resident set so far (VmHWM), in MiB."""
        assert self.process is not None
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        raise AssertionError(f"no VmHWM for {self.process.pid}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-20_000:] if self.log_path.exists() else ""
