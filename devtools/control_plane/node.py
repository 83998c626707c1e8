"""A real node beside the local control plane: containerd + runc + bridge CNI, a kubelet,
kube-scheduler and kube-proxy, so pods really run (`make node-up`, `make e2e`).

Facts it rests on (../shared/FIELD-NOTES.md, "A real node on this machine"): root here lacks
CAP_SYS_RESOURCE, so containerd must not lower a container's oom_score_adj; the kubelet runs on
cgroup v1 with cgroupfs; pods reach the apiserver (loopback only) through a DNAT of the
`kubernetes` Service address on the bridge; nothing leaves the machine (no default route in
pods, forwarding between the bridge and any other interface dropped, no masquerade).
Needs root (network, mounts, cgroups). Images come from OCI archives, never a registry.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

NODE_NAME = "undolog-node"
BRIDGE = "undolog0"
POD_SUBNET = "10.244.0.0/24"
NODE_IP = "10.244.0.1"  # the bridge's address: a node address may not be loopback
SERVICE_SUBNET = "10.0.0.0/24"
API_SERVICE_IP = "10.0.0.1"
PAUSE_IMAGE = "localhost/undolog/pause:local"  # made by tools/image.sh
CHAIN = "UNDOLOG-NODE"
# kubelet sets these on start (it expects a dedicated machine); node-down puts them back.
KUBELET_SYSCTLS = ("vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops")
NODE_PROCESSES = ("containerd", "kubelet", "kube-scheduler", "kube-proxy")


class NodeError(RuntimeError):
    """The node could not be prepared or cleaned up."""


def _run(*args: str, check: bool = True, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(args, capture_output=True, text=True, env=env, check=False)
    if check and result.returncode != 0:
        output = result.stderr.strip() or result.stdout.strip()
        raise NodeError(f"{' '.join(args)} failed ({result.returncode}): {output}")
    return result


@dataclass(frozen=True)
class NodePorts:
    apiserver: int  # the loopback port pods reach as 10.0.0.1:443
    kubelet: int
    kubelet_healthz: int
    scheduler: int
    proxy_healthz: int
    proxy_metrics: int


class NodeHost:
    """The files, network and kernel settings of the node; the processes are started by the
    control plane, which already knows how to start, find and stop its processes."""

    def __init__(self, state_dir: Path, bin_dir: Path, pki: Path) -> None:
        self.dir = state_dir / "node"
        self.bin_dir = bin_dir
        self.pki = pki
        self.socket = self.dir / "containerd" / "containerd.sock"

    # -- before the processes ----------------------------------------------------------------

    def prepare(self, ports: NodePorts) -> None:
        if os.geteuid() != 0:
            raise NodeError("a node needs root (network, mounts, cgroups): run as root or with sudo")
        for tool in ("runc", "iptables", "ip"):
            if shutil.which(tool) is None:
                raise NodeError(f"{tool} not found: `make node-deps` installs runc, iptables and the CNI plugins")
        if not Path("/usr/lib/cni/bridge").exists():
            raise NodeError("/usr/lib/cni/bridge not found: `make node-deps` installs containernetworking-plugins")
        self.dir.mkdir(parents=True, exist_ok=True)
        self._save_sysctls()
        self._network(ports.apiserver)
        self._write_configs(ports)

    def _save_sysctls(self) -> None:
        saved = self.dir / "sysctls.json"
        if not saved.exists():  # the first values seen are the machine's own
            values = {key: Path("/proc/sys", key).read_text().strip() for key in KUBELET_SYSCTLS}
            saved.write_text(json.dumps(values))

    def _network(self, apiserver_port: int) -> None:
        if _run("ip", "link", "show", BRIDGE, check=False).returncode != 0:
            _run("ip", "link", "add", BRIDGE, "type", "bridge")
            _run("ip", "addr", "add", f"{NODE_IP}/24", "dev", BRIDGE)
        _run("ip", "link", "set", BRIDGE, "up")
        # Pods' packets to the Service address are sent to the apiserver on loopback.
        Path(f"/proc/sys/net/ipv4/conf/{BRIDGE}/route_localnet").write_text("1")
        self._remove_rules()
        for table in ("filter", "nat"):
            _run("iptables", "-t", table, "-N", CHAIN)
        forward = (
            ("-i", BRIDGE, "-o", BRIDGE, "-j", "RETURN"),  # pod to pod (through Services too)
            ("-i", BRIDGE, "-j", "DROP"),  # never out of the machine
            ("-o", BRIDGE, "-j", "DROP"),  # nor in from elsewhere
        )
        for rule in forward:
            _run("iptables", "-t", "filter", "-A", CHAIN, *rule)
        _run("iptables", "-t", "filter", "-I", "FORWARD", "1", "-j", CHAIN)
        _run(
            "iptables", "-t", "nat", "-A", CHAIN, "-i", BRIDGE, "-d", f"{API_SERVICE_IP}/32", "-p", "tcp",
            "--dport", "443", "-j", "DNAT", "--to-destination", f"127.0.0.1:{apiserver_port}",
        )  # fmt: skip
        _run("iptables", "-t", "nat", "-I", "PREROUTING", "1", "-j", CHAIN)

    def _remove_rules(self) -> None:
        for table, parent in (("filter", "FORWARD"), ("nat", "PREROUTING")):
            while _run("iptables", "-t", table, "-D", parent, "-j", CHAIN, check=False).returncode == 0:
                pass
            _run("iptables", "-t", table, "-F", CHAIN, check=False)
            _run("iptables", "-t", table, "-X", CHAIN, check=False)

    @staticmethod
    def _remove_kubelet_chains() -> None:
        """The chains a kubelet adds to iptables and ip6tables, and never removes (KUBE-FIREWALL
        drops packets to 127.0.0.0/8 from other addresses, which a machine without a node does not)."""
        for iptables in ("iptables", "ip6tables"):
            for table in ("filter", "nat", "mangle"):
                for parent in ("INPUT", "OUTPUT"):
                    while _run(iptables, "-t", table, "-D", parent, "-j", "KUBE-FIREWALL", check=False).returncode == 0:
                        pass
                for chain in ("KUBE-FIREWALL", "KUBE-KUBELET-CANARY", "KUBE-IPTABLES-HINT"):
                    if _run(iptables, "-t", table, "-F", chain, check=False).returncode == 0:
                        _run(iptables, "-t", table, "-X", chain, check=False)

    def _write_configs(self, ports: NodePorts) -> None:
        cni = self.dir / "cni"
        (cni / "net.d").mkdir(parents=True, exist_ok=True)
        network = {
            "cniVersion": "1.0.0",
            "name": "undolog",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": True,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "dataDir": str(cni / "ipam"),
                        "ranges": [[{"subnet": POD_SUBNET, "gateway": NODE_IP}]],
                        # Services only: no default route, so nothing is sent off the machine.
                        "routes": [{"dst": SERVICE_SUBNET}],
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }
        (cni / "net.d" / "10-undolog.conflist").write_text(json.dumps(network, indent=2))
        containerd = self.dir / "containerd"
        containerd.mkdir(parents=True, exist_ok=True)
        (self.dir / "containerd.toml").write_text(
            f"""version = 3
root = "{containerd / "root"}"
state = "{containerd / "state"}"

[grpc]
  address = "{self.socket}"

[plugins.'io.containerd.cri.v1.runtime']
  # Root here may not lower oom_score_adj (no CAP_SYS_RESOURCE); runc fails without this.
  restrict_oom_score_adj = true
  # Network namespaces under our own state, so node-down finds every one of them.
  netns_mounts_under_state_dir = true
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "{cni / "net.d"}"

[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = "{PAUSE_IMAGE}"

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
"""
        )
        kubelet = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": NODE_IP,
            "port": ports.kubelet,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": ports.kubelet_healthz,
            # Only the apiserver's client certificate (signed by the client CA) is let in.
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": False},
                "x509": {"clientCAFile": str(self.pki / "client-ca.crt")},
            },
            "authorization": {"mode": "AlwaysAllow"},
            "cgroupDriver": "cgroupfs",
            "failCgroupV1": False,  # this machine mounts cgroup v1 hierarchies
            "failSwapOn": False,
            "oomScoreAdj": 0,
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "serializeImagePulls": False,
            # A shared development machine: never evict the test's pods or delete its images.
            "evictionHard": {"memory.available": "50Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
        }
        (self.dir / "kubelet.yaml").write_text(json.dumps(kubelet, indent=2))
        proxy = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(self.dir / "kube-proxy.kubeconfig")},
            "mode": "iptables",
            "clusterCIDR": POD_SUBNET,
            "hostnameOverride": NODE_NAME,
            "bindAddress": NODE_IP,
            "healthzBindAddress": f"127.0.0.1:{ports.proxy_healthz}",
            "metricsBindAddress": f"127.0.0.1:{ports.proxy_metrics}",
            "nodePortAddresses": [f"{NODE_IP}/32"],
            # Leave the machine's conntrack settings alone.
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        }
        (self.dir / "kube-proxy.yaml").write_text(json.dumps(proxy, indent=2))

    # -- process arguments -------------------------------------------------------------------

    def containerd_args(self) -> list[str]:
        return [f"--config={self.dir / 'containerd.toml'}", "--log-level=warn"]

    def kubelet_args(self) -> list[str]:
        return [
            f"--config={self.dir / 'kubelet.yaml'}",
            f"--kubeconfig={self.dir / 'kubelet.kubeconfig'}",
            f"--root-dir={self.dir / 'kubelet'}",
            f"--cert-dir={self.dir / 'kubelet' / 'pki'}",
            f"--hostname-override={NODE_NAME}",
            f"--node-ip={NODE_IP}",
            "--v=1",
        ]

    def scheduler_args(self, port: int) -> list[str]:
        return [
            f"--kubeconfig={self.dir / 'kube-scheduler.kubeconfig'}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
        ]

    def proxy_args(self) -> list[str]:
        return [f"--config={self.dir / 'kube-proxy.yaml'}"]

    # -- images ------------------------------------------------------------------------------

    def ctr(self, *args: str) -> subprocess.CompletedProcess[str]:
        return _run(str(self.bin_dir / "ctr"), f"--address={self.socket}", "--namespace=k8s.io", *args)

    def import_image(self, archive: Path) -> None:
        """Make an OCI archive's image available to pods (they never pull)."""
        if not archive.is_file():
            raise NodeError(f"{archive} not found: run `make image` first")
        self.ctr("images", "import", str(archive))

    def containerd_ready(self) -> bool:
        return (
            self.socket.exists()
            and _run(str(self.bin_dir / "ctr"), f"--address={self.socket}", "version", check=False).returncode == 0
        )

    # -- after the processes -----------------------------------------------------------------

    def stop_pods(self) -> None:
        """Stop and remove every pod through the CRI, which also tears down their networks."""
        if not self.containerd_ready():
            return
        crictl = [str(self.bin_dir / "crictl"), f"--runtime-endpoint=unix://{self.socket}", "--timeout=30s"]
        _run(*crictl, "rmp", "--all", "--force", check=False)

    def clean(self) -> None:
        """After the processes stopped: leftover shims and containers, mounts, netns, kube-proxy's
        and our iptables rules, the bridge, and the kernel settings the kubelet changed."""
        self._kill_leftovers()
        self._unmount_under(self.dir)
        if (self.bin_dir / "kube-proxy").exists() and (self.dir / "kube-proxy.yaml").exists():
            _run(str(self.bin_dir / "kube-proxy"), "--cleanup", f"--config={self.dir / 'kube-proxy.yaml'}", check=False)
        self._remove_rules()
        self._remove_kubelet_chains()
        _run("ip", "link", "delete", BRIDGE, check=False)
        saved = self.dir / "sysctls.json"
        if saved.exists():
            for key, value in json.loads(saved.read_text()).items():
                with contextlib.suppress(OSError):
                    Path("/proc/sys", key).write_text(value)
            saved.unlink()
        self._remove_cgroups()

    def _kill_leftovers(self) -> None:
        marker = str(self.socket).encode()
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                cmdline = (proc / "cmdline").read_bytes()
                cgroup = (proc / "cgroup").read_text()
            except OSError:
                continue
            if marker in cmdline or "/kubepods" in cgroup:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(proc.name), signal.SIGKILL)
        time.sleep(0.2)  # SIGKILL is asynchronous; mounts held by the dying are released after

    @staticmethod
    def _unmount_under(directory: Path) -> None:
        prefix = str(directory.resolve()) + "/"
        mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
        for mount in sorted((m for m in mounts if m.startswith(prefix)), key=len, reverse=True):
            _run("umount", "--lazy", mount, check=False)

    @staticmethod
    def _remove_cgroups() -> None:
        for hierarchy in Path("/sys/fs/cgroup").iterdir():
            top = hierarchy / "kubepods"
            if not top.is_dir():
                continue
            deepest_first = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True)
            for directory in deepest_first:
                with contextlib.suppress(OSError):
                    directory.rmdir()
            with contextlib.suppress(OSError):
                top.rmdir()
