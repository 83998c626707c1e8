"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, kube-controller-manager;
with `node=True` also a node that runs pods (devtools/control_plane/node.py).

What controller-runtime's envtest does, in Python so `make demo`, `make cluster-up` and the
test fixtures share it. Binaries come from `make tools` (bin/); state lives in one directory
(pki/, etcd/, logs/, kubeconfig, state.json) so a second process can find and stop it.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import yaml

from devtools.control_plane.node import NODE_NAME, NODE_PROCESSES, NodeHost, NodePorts
from devtools.control_plane.pki import write_pki

START_TIMEOUT = 60.0  # envtest allows 20 s per process; 2 cores need more headroom
STOP_TIMEOUT = 10.0
PROCESSES = ("etcd", "kube-apiserver", "kube-controller-manager")
# What running pods needs besides: Deployments, their pods' ServiceAccounts and CA, the not-ready
# taint lifted, Service endpoints for kube-proxy, and the aggregated view/edit roles filled.
NODE_CONTROLLERS = [
    "deployment-controller",
    "replicaset-controller",
    "serviceaccount-controller",
    "root-ca-certificate-publisher-controller",
    "node-lifecycle-controller",
    "endpointslice-controller",
    "clusterrole-aggregation-controller",
]


class ControlPlaneError(RuntimeError):
    """The local control plane could not be started or stopped."""


@dataclass
class RunState:
    """What state.json records, so another process can find and stop the control plane."""

    server: str
    pids: dict[str, int] = field(default_factory=dict)
    commands: dict[str, list[str]] = field(default_factory=dict)  # arguments, to restart a process


@dataclass(frozen=True)
class Endpoints:
    server: str
    kubeconfig: Path
    started_in_seconds: float
    reused: bool
    restarted: list[str] = field(default_factory=list)  # processes found dead and started again


def free_ports(count: int) -> list[int]:
    """`count` distinct free ports on loopback. The sockets are held until all are bound: ports
    picked one at a time came back the same about once in 10,000 pairs, and an operator given
    one port for its health and its metrics exited (its health server could not bind) after
    the metrics server on that port had answered the harness's health check."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) for _ in range(count)]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]


def free_port() -> int:
    return free_ports(1)[0]


def port_taken(port: int) -> bool:
    """Whether a process listens on `port` on loopback. The probe binds as the control plane's
    servers do (SO_REUSEADDR): without it, the connections a stopped apiserver closed, lingering
    in TIME_WAIT, made its own port look taken and `up` moved it for nothing."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def _alive(pid: int) -> bool:
    """True for a running process; a zombie (exited, not reaped) counts as gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _command_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0].decode()
    except OSError:
        return ""


class LocalControlPlane:
    def __init__(
        self,
        state_dir: Path,
        bin_dir: Path,
        *,
        durable: bool = False,
        node: bool = False,
        images: Sequence[Path] = (),
    ) -> None:
        self.state_dir = state_dir.resolve()
        self.bin_dir = bin_dir.resolve()
        self.durable = durable  # etcd fsyncs only when the run must survive a crash of the machine
        self.with_node = node  # a kubelet and what pods need; images: OCI archives it imports
        self.images = [image.resolve() for image in images]
        self.pki = self.state_dir / "pki"
        self.logs = self.state_dir / "logs"
        self.kubeconfig = self.state_dir / "kubeconfig"
        self.state_file = self.state_dir / "state.json"
        self._children: dict[str, subprocess.Popen[bytes]] = {}
        self.node = NodeHost(self.state_dir, self.bin_dir, self.pki)

    @property
    def etcd_url(self) -> str:
        """etcd's client URL (its HTTP gateway answers what etcdctl asks: status, compaction)."""
        state = self._read_state()
        if state is None:
            raise ControlPlaneError(f"no control plane runs from {self.state_dir}")
        flag = next(a for a in state.commands["etcd"] if a.startswith("--listen-client-urls="))
        return flag.split("=", 1)[1]

    @property
    def processes(self) -> tuple[str, ...]:
        return PROCESSES + NODE_PROCESSES if self.with_node else PROCESSES

    # -- lifecycle ---------------------------------------------------------------------------

    def up(self) -> Endpoints:
        """Start the control plane, or reuse the one already running from this directory. When
        some of its processes died, they are started again on the data they had: only `reset`
        deletes a ledger."""
        begin = time.monotonic()
        state = self._read_state()
        if state and "kubelet" in state.commands:
            self.with_node = True  # one started with a node keeps it (never replaced, data lost)
        if state and self._healthy(state):
            return Endpoints(state.server, self.kubeconfig, time.monotonic() - begin, reused=True)
        if state and set(state.commands) == set(self.processes) and (self.state_dir / "etcd").is_dir():
            if not self.with_node and not any(self._owned(n, p) for n, p in state.pids.items()) and self._taken(state):
                state = self._moved(state)
            restarted = self._restart_dead(state)
            return Endpoints(state.server, self.kubeconfig, time.monotonic() - begin, reused=True, restarted=restarted)
        self.down()  # a half-started one (no data yet) is replaced cleanly
        self._check_binaries()
        for directory in (self.pki, self.state_dir / "etcd"):
            shutil.rmtree(directory, ignore_errors=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        write_pki(self.pki)
        etcd_client, etcd_peer, apiserver_port, kcm_port = free_ports(4)
        state = RunState(server=f"https://127.0.0.1:{apiserver_port}")
        try:
            self._start("etcd", self._etcd_args(etcd_client, etcd_peer), state)
            self._wait("etcd", lambda: self._etcd_healthy(etcd_client))
            self._start("kube-apiserver", self._apiserver_args(etcd_client, apiserver_port), state)
            self._wait("kube-apiserver", lambda: self._get(state.server, "/readyz"))
            self._write_kubeconfig(state.server, self.kubeconfig, "admin")
            self._write_kubeconfig(state.server, self.state_dir / "controller-manager.kubeconfig", "controller-manager")
            self._start("kube-controller-manager", self._controller_manager_args(kcm_port), state)
            self._wait("default namespace", lambda: self._get(state.server, "/api/v1/namespaces/default"))
            if self.with_node:
                self._node_up(state, apiserver_port)
        except BaseException:
            self.down()
            raise
        return Endpoints(state.server, self.kubeconfig, time.monotonic() - begin, reused=False)

    def _restart_dead(self, state: RunState) -> list[str]:
        """Start again, with their own arguments and data, the processes that are not running."""
        self._check_binaries()
        self.logs.mkdir(parents=True, exist_ok=True)
        dead = [name for name in state.commands if not self._owned(name, state.pids.get(name, 0))]
        for name in dead:
            self._start(name, state.commands[name], state)
            if name == "etcd":
                client = next(a for a in state.commands[name] if a.startswith("--listen-client-urls="))
                port = int(client.rsplit(":", 1)[1])
                self._wait("etcd", functools.partial(self._etcd_healthy, port))
        self._wait("kube-apiserver", lambda: self._get(state.server, "/readyz"))
        return dead

    @staticmethod
    def _ports(state: RunState) -> dict[str, int]:
        """The ports a stopped control plane listened on, from its arguments."""
        found: dict[str, int] = {}
        for name, args in state.commands.items():
            for arg in args:
                flag, _, value = arg.partition("=")
                if flag in ("--listen-client-urls", "--listen-peer-urls", "--secure-port"):
                    found[f"{name} {flag}"] = int(value.rsplit(":", 1)[-1])
        return found

    def _taken(self, state: RunState) -> bool:
        return any(port_taken(port) for port in self._ports(state).values())

    def _moved(self, state: RunState) -> RunState:
        """The same data and certificates on new ports (another process took an old one), the
        kubeconfigs rewritten for the new address."""
        etcd_client, etcd_peer, apiserver_port, kcm_port = free_ports(4)
        moved = RunState(server=f"https://127.0.0.1:{apiserver_port}")
        moved.commands = {
            "etcd": self._etcd_args(etcd_client, etcd_peer),
            "kube-apiserver": self._apiserver_args(etcd_client, apiserver_port),
            "kube-controller-manager": self._controller_manager_args(kcm_port),
        }
        self._write_kubeconfig(moved.server, self.kubeconfig, "admin")
        self._write_kubeconfig(moved.server, self.state_dir / "controller-manager.kubeconfig", "controller-manager")
        self.state_file.write_text(json.dumps(asdict(moved)))
        return moved

    def reset(self) -> list[int]:
        """Stop everything and delete the data (every saga), the certificates and the logs."""
        stopped = self.down()
        shutil.rmtree(self.state_dir, ignore_errors=True)
        return stopped

    def down(self) -> list[int]:
        """Stop every process this directory started; returns the pids that were stopped."""
        state = self._read_state()
        pids = {name: pid for name, pid in state.pids.items() if self._owned(name, pid)} if state else {}
        # One at a time, dependents first: an apiserver whose etcd is gone hangs on shutdown.
        for name in reversed(PROCESSES + NODE_PROCESSES):
            if name == "containerd" and state and "containerd" in state.commands:
                self.node.stop_pods()  # through the CRI while containerd still runs
            if name in pids:
                self._stop(pids[name])
            if name == "containerd" and state and "containerd" in state.commands:
                self.node.clean()
        self._reap(block=True)
        if state and "kubelet" not in state.commands and (self.state_dir / "etcd").is_dir():
            # Kept, pids gone: `up` starts it again on the same data and certificates. A node's
            # network and kernel settings were undone: one with a node starts afresh.
            self.state_file.write_text(json.dumps(asdict(RunState(state.server, {}, state.commands))))
        else:
            self.state_file.unlink(missing_ok=True)
        still = [pid for pid in pids.values() if _alive(pid)]
        if still:
            raise ControlPlaneError(f"processes {still} did not stop; kill them and remove {self.state_dir}")
        return list(pids.values())

    def _stop(self, pid: int) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, sig)
            deadline = time.monotonic() + STOP_TIMEOUT
            while _alive(pid) and time.monotonic() < deadline:
                self._reap()  # a child of ours must be waited for, or it lingers as a zombie
                time.sleep(0.02)
            if not _alive(pid):
                return

    def restart(self, name: str, down_for: float = 0.0) -> float:
        """Stop one process (SIGTERM, as an upgrade or a node drain would), leave it down for
        `down_for` seconds, and start it again with the same arguments and data; returns the
        seconds from the stop until the apiserver is ready again."""
        state = self._read_state()
        if state is None or name not in state.pids:
            raise ControlPlaneError(f"{name} is not running from {self.state_dir}")
        begin = time.monotonic()
        self._stop(state.pids[name])
        self._reap()
        time.sleep(down_for)
        self._start(name, state.commands[name], state)
        self._wait(f"{name} restart", lambda: self._get(state.server, "/readyz"))
        return time.monotonic() - begin

    def running_pids(self) -> dict[str, int]:
        state = self._read_state()
        return {name: pid for name, pid in state.pids.items() if self._owned(name, pid)} if state else {}

    # -- processes ---------------------------------------------------------------------------

    def _check_binaries(self) -> None:
        wanted = [*self.processes, "ctr", "crictl", "containerd-shim-runc-v2"] if self.with_node else PROCESSES
        missing = [name for name in wanted if not (self.bin_dir / name).is_file()]
        if missing:
            raise ControlPlaneError(f"{', '.join(missing)} not found in {self.bin_dir}: run `make tools` first")

    def _start(self, name: str, args: list[str], state: RunState) -> None:
        log = (self.logs / f"{name}.log").open("ab")
        process = subprocess.Popen(
            [str(self.bin_dir / name), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "PATH": f"{self.bin_dir}:{os.environ.get('PATH', '')}"},  # containerd finds its shim
            start_new_session=True,  # its own process group: down() stops it and anything it forks
        )
        log.close()
        self._children[name] = process
        state.pids[name] = process.pid
        state.commands[name] = args
        self.state_file.write_text(json.dumps(asdict(state)))

    def _wait(self, what: str, ready: Callable[[], bool]) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            for name, process in self._children.items():
                if process.poll() is not None:
                    raise ControlPlaneError(
                        f"{name} exited with {process.returncode} while waiting for {what}; "
                        f"see {self.logs / (name + '.log')}"
                    )
            if ready():
                return
            time.sleep(0.1)
        raise ControlPlaneError(f"{what} not ready after {START_TIMEOUT:.0f} s; see the logs in {self.logs}")

    def _owned(self, name: str, pid: int) -> bool:
        """The pid still runs our binary (guards against a recycled pid)."""
        return pid > 0 and _alive(pid) and Path(_command_of(pid)).name == name

    def _reap(self, block: bool = False) -> None:
        for process in self._children.values():
            if block:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=STOP_TIMEOUT)
            else:
                process.poll()
        if block:
            self._children.clear()

    # -- arguments ---------------------------------------------------------------------------

    def _etcd_args(self, client_port: int, peer_port: int) -> list[str]:
        client, peer = f"http://127.0.0.1:{client_port}", f"http://127.0.0.1:{peer_port}"
        args = [
            "--name=local",
            f"--data-dir={self.state_dir / 'etcd'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=local={peer}",
            "--log-level=warn",
        ]
        if not self.durable:
            args.append("--unsafe-no-fsync=true")
        return args

    def _node_up(self, state: RunState, apiserver_port: int) -> None:
        ports = NodePorts(apiserver_port, *free_ports(5))
        self.node.prepare(ports)
        for user, name in (("node", "kubelet"), ("scheduler", "kube-scheduler"), ("proxy", "kube-proxy")):
            self._write_kubeconfig(state.server, self.node.dir / f"{name}.kubeconfig", user)
        self._start("containerd", self.node.containerd_args(), state)
        self._wait("containerd", self.node.containerd_ready)
        for image in self.images:
            self.node.import_image(image)
        # RBAC only (no Node authorizer): the kubelet acts with the bootstrap role system:node.
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "undolog-local:nodes"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:node"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:nodes"}],
        }
        with self._client() as client:
            path = "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings"
            response = client.post(state.server + path, json=binding)
            if response.status_code not in (201, 409):
                raise ControlPlaneError(f"ClusterRoleBinding for nodes: {response.status_code} {response.text}")
        self._start("kubelet", self.node.kubelet_args(), state)
        self._start("kube-scheduler", self.node.scheduler_args(ports.scheduler), state)
        self._start("kube-proxy", self.node.proxy_args(), state)
        self._wait(f"node {NODE_NAME} Ready", lambda: self._node_ready(state.server))

    def _node_ready(self, server: str) -> bool:
        try:
            with self._client() as client:
                response = client.get(f"{server}/api/v1/nodes/{NODE_NAME}")
        except httpx.HTTPError:
            return False
        if response.status_code != 200:
            return False
        node = response.json()
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions", []))
        return ready and not any(t["key"] == "node.kubernetes.io/not-ready" for t in node["spec"].get("taints", []))

    def _apiserver_args(self, etcd_port: int, port: int) -> list[str]:
        pki = self.pki
        if self.with_node:
            node = [
                # Pods get ServiceAccount tokens; the apiserver reaches the kubelet for logs and exec.
                f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
                f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
                "--kubelet-preferred-address-types=InternalIP",
            ]
        else:
            node = ["--disable-admission-plugins=ServiceAccount"]
        return [
            *node,
            f"--etcd-servers=http://127.0.0.1:{etcd_port}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={port}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'client-ca.crt'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki / 'service-account.pub'}",
            f"--service-account-signing-key-file={pki / 'service-account.key'}",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--endpoint-reconciler-type=none",  # the reconciler refuses a loopback advertise address
            "--authorization-mode=RBAC",
            "--profiling=false",
            # On SIGTERM, close watches within 2 s, as production control planes configure it;
            # without it the apiserver holds open watch streams until it is killed (10 s here).
            "--shutdown-watch-termination-grace-period=2s",
        ]

    def _controller_manager_args(self, port: int) -> list[str]:
        # Garbage collection removes a deleted saga's UndoEntries (ownerReferences);
        # the namespace controller empties namespaces that tests delete.
        controllers = ["garbage-collector-controller", "namespace-controller"]
        if self.with_node:
            controllers += NODE_CONTROLLERS
        return [
            f"--kubeconfig={self.state_dir / 'controller-manager.kubeconfig'}",
            f"--service-account-private-key-file={self.pki / 'service-account.key'}",
            f"--root-ca-file={self.pki / 'serving-ca.crt'}",  # kube-root-ca.crt, in pods' tokens
            f"--controllers={','.join(controllers)}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
        ]

    # -- health ------------------------------------------------------------------------------

    def _client(self) -> httpx.Client:
        context = ssl.create_default_context(cafile=str(self.pki / "serving-ca.crt"))
        context.load_cert_chain(self.pki / "admin.crt", self.pki / "admin.key")
        return httpx.Client(verify=context, timeout=5.0)

    def _get(self, server: str, path: str) -> bool:
        try:
            with self._client() as client:
                return client.get(server + path).status_code == 200
        except httpx.HTTPError:
            return False

    @staticmethod
    def _etcd_healthy(port: int) -> bool:
        try:
            response = httpx.get(f"http://127.0.0.1:{port}/health", timeout=2.0)
        except httpx.HTTPError:
            return False
        return response.status_code == 200 and response.json().get("health") == "true"

    def _healthy(self, state: RunState) -> bool:
        if set(state.pids) != set(self.processes):
            return False
        return all(self._owned(n, p) for n, p in state.pids.items()) and self._get(state.server, "/readyz")

    def _read_state(self) -> RunState | None:
        try:
            return RunState(**json.loads(self.state_file.read_text()))
        except (OSError, ValueError, TypeError):
            return None

    # -- kubeconfig --------------------------------------------------------------------------

    def _write_kubeconfig(self, server: str, path: Path, user: str) -> None:
        def b64(name: str) -> str:
            return base64.b64encode((self.pki / name).read_bytes()).decode()

        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "undolog-local",
                    "cluster": {"server": server, "certificate-authority-data": b64("serving-ca.crt")},
                }
            ],
            "users": [
                {
                    "name": user,
                    "user": {
                        "client-certificate-data": b64(f"{user}.crt"),
                        "client-key-data": b64(f"{user}.key"),
                    },
                }
            ],
            "contexts": [{"name": "undolog-local", "context": {"cluster": "undolog-local", "user": user}}],
            "current-context": "undolog-local",
        }
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
