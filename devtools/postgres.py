"""A real PostgreSQL server on loopback for the archive's tests and benchmarks: Debian's
`postgresql` package, `initdb` into a folder of the caller's, run as an unprivileged user (the
server refuses to run as root: as root, the package's `postgres` user runs it)."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from devtools.control_plane.local import free_port

START_TIMEOUT = 60.0
PASSWORD = "undolog-test"


def server_binaries() -> Path:
    """The newest installed server's bin folder (Debian: /usr/lib/postgresql/<major>/bin)."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), key=lambda p: int(p.parent.parent.name))
    if not found:
        raise RuntimeError("PostgreSQL's server is not installed (make test installs Debian's postgresql)")
    return found[-1].parent


@dataclass
class LocalPostgres:
    """`up()` starts it (a database `undolog`, a user `undolog` with a password, on 127.0.0.1);
    `stop()` / `start()` stop and start the same server on the same data; `down()` stops it."""

    directory: Path
    port: int = 0

    @property
    def data(self) -> Path:
        return self.directory / "data"

    @property
    def dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} dbname=undolog user=undolog password={PASSWORD} connect_timeout=3"

    def _run(self, *command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        env = {**os.environ, "PGPASSWORD": PASSWORD}
        return subprocess.run(
            [*as_user, *command], check=check, capture_output=True, text=True, timeout=START_TIMEOUT, env=env
        )

    def up(self) -> LocalPostgres:
        if os.geteuid() == 0:
            # The server's files belong to the user that runs it, in a folder it can reach (pytest's
            # folders are root's alone).
            self.directory = Path(tempfile.mkdtemp(prefix="undolog-postgres-"))
            user = pwd.getpwnam("postgres")
            os.chown(self.directory, user.pw_uid, user.pw_gid)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        binaries = server_binaries()
        password_file = self.directory / "password"
        password_file.write_text(PASSWORD + "\n")
        if os.geteuid() == 0:
            shutil.chown(password_file, "postgres")
        self._run(
            str(binaries / "initdb"),
            "-D",
            str(self.data),
            "-U",
            "undolog",
            "--auth=scram-sha-256",
            f"--pwfile={password_file}",
            "-E",
            "UTF8",
            "--no-sync",
        )
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(
                f"listen_addresses = '127.0.0.1'\nport = {self.port}\nunix_socket_directories = '{self.directory}'\n"
                "fsync = on\nmax_connections = 50\n"
            )
        self.start()
        self._createdb(binaries)
        return self

    def _createdb(self, binaries: Path) -> None:
        self._run(str(binaries / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "undolog", "undolog")

    def start(self) -> None:
        log = self.directory / "server.log"
        self._run(str(server_binaries() / "pg_ctl"), "-D", str(self.data), "-l", str(log), "-w", "-t", "60", "start")
        deadline = time.monotonic() + START_TIMEOUT
        ready = [str(server_binaries() / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)]
        while self._run(*ready, check=False).returncode:
            if time.monotonic() > deadline:
                raise RuntimeError(f"PostgreSQL did not accept connections within {START_TIMEOUT:.0f} s: see {log}")
            time.sleep(0.1)

    def stop(self) -> None:
        """Stop it at once (`-m immediate`: as a crash or a network cut would, its clients cut off)."""
        self._run(str(server_binaries() / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop", check=False)

    def kill(self) -> None:
        """SIGKILL the postmaster and every backend (a crash of the host, not a shutdown): no
        client is told, connections simply break; `start()` brings it back on the same data."""
        pid_file = self.data / "postmaster.pid"
        if not pid_file.exists():
            return
        postmaster = int(pid_file.read_text().split()[0])
        with contextlib.suppress(ProcessLookupError):
            os.kill(postmaster, signal.SIGSTOP)  # it forks no backend while its children are listed
        children = [
            int(stat.parent.name) for stat in Path("/proc").glob("[0-9]*/stat") if _parent_of(stat) == postmaster
        ]
        for pid in (*children, postmaster):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + START_TIMEOUT
        while any(_alive(pid) for pid in (postmaster, *children)):
            if time.monotonic() > deadline:
                raise RuntimeError(f"PostgreSQL's processes outlived SIGKILL for {START_TIMEOUT:.0f} s")
            time.sleep(0.05)
        # As after a host's crash: killed processes left unreaped (zombies, where PID 1 is slow to
        # reap) still answer kill(pid, 0), and their lock files would refuse the next start.
        for lock in (pid_file, *self.directory.glob(".s.PGSQL.*.lock")):
            lock.unlink(missing_ok=True)

    def down(self) -> None:
        self._run(str(server_binaries() / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop", check=False)
        if os.geteuid() == 0:
            shutil.rmtree(self.directory, ignore_errors=True)


def _parent_of(stat: Path) -> int | None:
    """The parent PID in a /proc/<pid>/stat (None once the process is gone)."""
    try:
        text = stat.read_text()
    except OSError:
        return None
    return int(text.rsplit(")", 1)[1].split()[1])


def _alive(pid: int) -> bool:
    """Running (a zombie, waiting for whoever adopted it to reap it, holds nothing)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return text.rsplit(")", 1)[1].split()[0] != "Z"
