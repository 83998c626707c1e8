"""The onboarding services as a pod behind a Service, for `make demo-helm` and the e2e tests:
deploy them, point the demo's Webhooks at them, and read their state from inside the pod."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PORTS = {"identity": 8101, "authorization": 8102, "email": 8103}
# kubectl with the given arguments; returns stdout and raises on failure.
Kubectl = Callable[..., str]


def deploy_services(kubectl: Kubectl, namespace: str, within: float = 120.0) -> str:
    """Run services.py in a pod (in-cluster.yaml) and wait until its Service routes; returns the
    Service's address (this cluster has no DNS, so the Webhooks name the address)."""
    kubectl("create", "configmap", "onboarding-services", "-n", namespace, f"--from-file={HERE / 'services.py'}")
    kubectl("apply", "-n", namespace, "-f", str(HERE / "in-cluster.yaml"))
    kubectl("rollout", "status", "-n", namespace, "deploy/onboarding-services", f"--timeout={within:.0f}s")
    address = kubectl("get", "service", "onboarding-services", "-n", namespace, "-o", "jsonpath={.spec.clusterIP}")
    # kube-proxy programs the Service a moment after the pod is Ready.
    deadline = time.monotonic() + within
    while True:
        try:
            services_state(kubectl, namespace, through=address)
            return address
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def webhooks(address: str) -> str:
    """webhooks.yaml with its loopback URLs pointed at the Service."""
    return (HERE / "webhooks.yaml").read_text().replace("127.0.0.1", address)


def services_state(kubectl: Kubectl, namespace: str, through: str = "127.0.0.1") -> dict[str, Any]:
    """GET /state of the three services from inside their pod (`through` the Service's address:
    the way the operator's pods reach them)."""
    script = (
        "import json, urllib.request as u; print(json.dumps({name: json.load(u.urlopen("
        f"'http://{through}:%d/state' % port, timeout=2)) for name, port in {PORTS!r}.items()}}))"
    )
    answer = kubectl("exec", "-n", namespace, "deploy/onboarding-services", "--", "python3", "-c", script)
    return dict(json.loads(answer))
