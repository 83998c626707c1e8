"""What every benchmark needs: a cluster (local control plane or KUBECONFIG), the CRDs, a
namespace, the operator as a process, and the apiserver's own count of write requests."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from devtools.control_plane import LocalControlPlane
from devtools.crds import CRDS
from prometheus_client.parser import text_string_to_metric_families
from tests.support.operator_process import OperatorProcess
from tests.support.participants import Received

from undolog.controller.leadership import LeaseSettings
from undolog.kube import Kube

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(os.environ.get("UNDOLOG_BIN_DIR", ROOT / "bin"))
WRITE_VERBS = {"POST", "PATCH", "PUT", "DELETE"}
RESULTS = ROOT / "bench" / "results"
# The ledger as production runs it: etcd fsyncs every write. UNDOLOG_BENCH_ETCD_FSYNC=0 gives the
# no-fsync figure for comparison, labelled as such in every table and result.
ETCD_FSYNC = os.environ.get("UNDOLOG_BENCH_ETCD_FSYNC", "1") != "0"
ETCD_MODE = (
    "etcd fsync on (as production)" if ETCD_FSYNC else "etcd fsync OFF (--unsafe-no-fsync: not a production figure)"
)


def print_table(headers: Sequence[str], rows: Iterable[Sequence[Any]], ledger: str = ETCD_MODE) -> None:
    """A markdown table on the terminal, to paste into docs/performance.md as is."""
    print(f"({ledger})")
    print("| " + " | ".join(headers) + " |")
    print("|" + "---|" * len(headers))
    for cells in rows:
        print("| " + " | ".join(str(c) for c in cells) + " |")


def save(name: str, results: Any) -> None:
    """bench/results/<name>.json"""
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps({"etcd_fsync": ETCD_FSYNC, "results": results}, indent=2))


@dataclass
class Bench:
    kube: Kube
    kubeconfig: Path
    work: Path
    local: LocalControlPlane | None = None

    def control_plane_cpu(self) -> float:
        """CPU seconds used so far by etcd and kube-apiserver (0 when KUBECONFIG is used)."""
        if self.local is None:
            return 0.0
        pids = self.local.running_pids()
        return sum(cpu_seconds(pids[name]) for name in ("etcd", "kube-apiserver") if name in pids)

    async def namespace(self, prefix: str = "bench") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        await self.kube.create_namespace(name, {})
        return name

    def operator(self, namespace: str) -> OperatorProcess:
        """An operator as installed: its default Lease (15 s), not the tests' short one (4 s),
        which a loaded apiserver renews late often enough to pause the operator's sending."""
        process = OperatorProcess(
            self.kubeconfig,
            namespace,
            self.work / "logs",
            extra_args=(),
            lease_seconds=LeaseSettings(namespace).lease_seconds,
        )
        process.start()
        return process

    async def writes(self) -> dict[str, int]:
        """Write requests the apiserver has served, by resource (from its /metrics)."""
        counts: dict[str, int] = {}
        for family in text_string_to_metric_families(await self.kube.raw_get("/metrics")):
            if family.name != "apiserver_request":
                continue
            for sample in family.samples:
                if sample.name.endswith("_total") and sample.labels.get("verb") in WRITE_VERBS:
                    resource = sample.labels.get("resource", "")
                    counts[resource] = counts.get(resource, 0) + int(sample.value)
        return counts


def go_client(bench: Bench, program: str) -> list[str]:
    """The command line of one of bench/'s Go clients, with the admin's client certificate."""
    return client_command(bench, [str(BIN / program)])


def client_command(bench: Bench, program: list[str]) -> list[str]:
    """`program`'s command line with the apiserver's URL and the admin's client certificate."""
    local = bench.local
    if local is None:
        raise RuntimeError(f"{program[-1]} needs the local control plane's client certificate (unset KUBECONFIG)")
    pki = local.pki
    return [
        *program,
        f"--server={bench.kube.server}",
        f"--ca={pki / 'serving-ca.crt'}",
        f"--cert={pki / 'admin.crt'}",
        f"--key={pki / 'admin.key'}",
    ]


@contextmanager
def floor_client(bench: Bench, namespace: str, participant: str, *, python: bool = False) -> Iterator[int]:
    """bench/goclients/floor (built by `make bench`) compensating the namespace's aborted sagas, calling
    `participant`: the least any controller does between an abort and its first call. Yields its pid.
    `python`: the same requests from Python (bench/python_floor.py)."""
    program = [sys.executable, "-m", "bench.python_floor"] if python else [str(BIN / "undolog-bench-floor")]
    process = subprocess.Popen(
        [*client_command(bench, program), f"--namespace={namespace}", f"--participant={participant}"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        if process.stdout.readline().strip() != "watching":
            raise RuntimeError(f"{program[-1]} did not start (exit code {process.wait(10)})")
        yield process.pid
    finally:
        process.kill()
        process.wait()


CEILING_RUNS = 3  # one short run moved between 123 and 276 writes/s within one sitting (2026-12-01)


@dataclass(frozen=True)
class Ceiling:
    """What a plain Go client got from the apiserver, run after run."""

    runs: list[float]  # writes per second

    @property
    def writes_per_second(self) -> float:
        return statistics.median(self.runs)

    def beside(self, operator_writes_per_second: float) -> dict[str, Any]:
        """The ceiling's figures for a result row, with the operator's fraction of it."""
        return {
            "go_ceiling_writes_per_second": round(self.writes_per_second, 1),
            "go_ceiling_runs_writes_per_second": [round(run, 1) for run in self.runs],
            "fraction_of_go_ceiling": round(operator_writes_per_second / self.writes_per_second, 2),
        }


async def go_ceiling(bench: Bench, namespace: str, entries: Sequence[str], writes: int, concurrency: int) -> Ceiling:
    """Writes per second a plain Go client (bench/goclients/ceiling, built by `make bench`) gets from the
    apiserver: the same status patches at the same concurrency, in the same run; CEILING_RUNS runs,
    whose median is the ceiling."""
    command = [
        *go_client(bench, "undolog-bench-ceiling"),
        f"--namespace={namespace}",
        f"--names={','.join(entries)}",
        f"--writes={writes}",
        f"--concurrency={concurrency}",
    ]
    runs = []
    for _ in range(CEILING_RUNS):
        done = await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True, check=True)
        runs.append(float(json.loads(done.stdout)["writes_per_second"]))
    return Ceiling(runs)


def install_crds(kubeconfig: Path) -> None:
    kubectl = [str(BIN / "kubectl"), f"--kubeconfig={kubeconfig}"]
    crds = str(ROOT / "crds")
    subprocess.run([*kubectl, "apply", "--server-side", "-f", crds], check=True, capture_output=True)
    subprocess.run([*kubectl, "wait", "--for=condition=Established", *CRDS], check=True, capture_output=True)


@asynccontextmanager
async def bench_cluster() -> AsyncIterator[Bench]:
    """A fresh control plane in a work folder, deleted afterwards unless UNDOLOG_BENCH_KEEP=1
    (then the operators' and the control plane's logs stay, to look into an odd figure)."""
    work = Path(tempfile.mkdtemp(prefix="undolog-bench-"))
    try:
        local: LocalControlPlane | None = None
        if os.environ.get("KUBECONFIG"):
            kubeconfig = Path(os.environ["KUBECONFIG"])
        else:
            local = LocalControlPlane(work / "control-plane", BIN, durable=ETCD_FSYNC)
            kubeconfig = local.up().kubeconfig
        try:
            await asyncio.to_thread(install_crds, kubeconfig)
            kube = await Kube.connect(str(kubeconfig))
            try:
                yield Bench(kube, kubeconfig, work, local)
            finally:
                await kube.close()
        finally:
            if local is not None:
                local.down()
    finally:
        if os.environ.get("UNDOLOG_BENCH_KEEP") == "1":
            print(f"kept the work folder {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


class RemoteParticipant:
    """tests.support.participants.Participant in its own process: the same recording, no GIL
    shared with the benchmark's client, reports fetched over HTTP."""

    def __init__(self) -> None:
        from devtools.control_plane.local import free_port

        self.port = free_port()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.participants", "--port", str(self.port)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        self.process.stdout.readline()  # "participant on <port>": it is listening
        self._received: list[Received] = []
        self._fetching = threading.Lock()  # polled from worker threads

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def received(self) -> list[Received]:
        """Everything received so far; only what is new is fetched (polled every second)."""
        with self._fetching:
            answer = httpx.get(self.url(f"/_received?from={len(self._received)}"), timeout=30)
            self._received.extend(Received(**r) for r in answer.json())
            return list(self._received)

    async def until(self, predicate: Callable[[list[Received]], bool], within: float) -> list[Received]:
        deadline = time.monotonic() + within
        while True:
            received = await asyncio.to_thread(self.received)
            if predicate(received):
                return received
            if time.monotonic() > deadline:
                raise TimeoutError(f"participant: condition not met in {within} s ({len(received)} received)")
            await asyncio.sleep(0.25)

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}


@asynccontextmanager
async def profiled(pid: int, path: Path | None, rate: int = 250) -> AsyncIterator[None]:
    """py-spy samples `pid` while the block runs (nothing when `path` is None): collapsed stacks
    in `path`, one line per distinct stack with its sample count, for `bench.profile`."""
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    spy = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).parent / "py-spy"), "record", f"--pid={pid}", f"--rate={rate}", "--format=raw",
        f"--output={path}", "--nonblocking", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    await asyncio.sleep(1.0)  # attached before the work starts
    try:
        yield
    finally:
        spy.send_signal(signal.SIGINT)  # py-spy writes what it sampled and exits
        await asyncio.wait_for(spy.wait(), 30)
