"""`make demo`: the onboarding story on a real control plane, end to end.

1. Start (or reuse) the local control plane, install the CRDs, start the operator and three
   small services, and register their undo endpoints as Webhooks.
2. The agent onboards a user; the email provider answers too late, the agent aborts, and the
   operator undoes the work newest-first. Nothing is left behind in any service.
3. Again with a broken compensation: the saga stops in Halted, where a person finds it (with
   `undolog list --phase halted` or `kubectl get sagas -l undolog.io/phase=halted`), reads why
   (`undolog show`), fixes the Webhook (`kubectl patch webhook`) and retries (`undolog retry`).
4. Prints the namespace and the commands to look around afterwards.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from devtools.control_plane import LocalControlPlane
from devtools.control_plane.local import free_ports
from devtools.crds import CRDS

from examples.onboarding.agent import onboard
from undolog.kube import Kube

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("UNDOLOG_BIN_DIR", ROOT / "bin"))


def banner(text: str) -> None:
    print(f"\n=== {text}", flush=True)


def kubectl(*args: str) -> str:
    binary = str(BIN / "kubectl") if (BIN / "kubectl").exists() else "kubectl"
    return subprocess.run([binary, *args], check=True, capture_output=True, text=True).stdout


def show(*args: str) -> None:
    print(f"$ kubectl {' '.join(args)}")
    print(kubectl(*args).rstrip(), flush=True)


def undolog(*args: str) -> None:
    """The on-call CLI, as a person types it (`undolog`; here the venv's, with KUBECONFIG set)."""
    print(f"$ undolog {' '.join(args)}")
    done = subprocess.run([sys.executable, "-m", "undolog.cli", *args], capture_output=True, text=True, check=True)
    print(done.stdout.rstrip(), flush=True)


def wait_http(url: str, within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"{url} did not answer within {within:.0f} s")


def state(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}/state", timeout=5) as answer:
        return dict(json.load(answer))


async def wait_phase(kube: Kube, namespace: str, name: str, phase: str, within: float = 60.0) -> dict[str, Any]:
    """Until the saga is in `phase` and its label says so (written right after, when it waits)."""
    deadline = time.monotonic() + within
    while True:
        body = await kube.get("sagas", namespace, name)
        labelled = (body["metadata"].get("labels") or {}).get("undolog.io/phase") == phase.lower()
        if body.get("status", {}).get("phase") == phase and labelled:
            return body
        if time.monotonic() > deadline:
            raise SystemExit(f"saga {name} is {body.get('status', {}).get('phase')}, expected {phase}")
        await asyncio.sleep(0.2)


def webhook(name: str, url: str) -> dict[str, Any]:
    return {
        "apiVersion": "undolog.io/v1beta1",
        "kind": "Webhook",
        "metadata": {"name": name},
        "spec": {"versions": [{"name": "v1", "url": url}], "timeoutSeconds": 5},
    }


async def story(namespace: str, urls: dict[str, str]) -> str:
    """The two runs; the halted-then-fixed saga's name."""
    kube = await Kube.connect()
    try:
        for name, url in (
            ("delete-user", f"{urls['identity']}/users/delete"),
            ("revoke-permissions", f"{urls['authorization']}/permissions/revoke"),
            ("recall-email", f"{urls['email']}/emails/recall"),
        ):
            await kube.create("webhooks", namespace, webhook(name, url))
        show("get", "webhooks", "-n", namespace)

        banner("Run 1: the agent onboards ada@example.com; the email provider answers too late")
        saga = await run_agent(namespace, urls, "ada@example.com")
        done = await wait_phase(kube, namespace, saga, "Compensated")
        print(f"saga {saga}: {done['status']['phase']} ({done['status']['message']})")
        show("get", "sagas,undo", "-n", namespace, "-o", "wide")
        left = report(urls)
        if left:
            raise SystemExit(f"something was left behind: {left}")
        print("nothing left behind: no user, no permission, the delivered email recalled")

        banner("Run 2: the revoke endpoint is misconfigured (404): the saga halts for a person")
        broken = webhook("revoke-permissions", f"{urls['authorization']}/permissions/revoke-everything")
        await kube.patch("webhooks", namespace, "revoke-permissions", {"spec": broken["spec"]})
        saga = await run_agent(namespace, urls, "grace@example.com")
        await wait_phase(kube, namespace, saga, "Halted")
        show("get", "sagas", "-n", namespace, "-l", "undolog.io/phase=halted")
        undolog("list", "-n", namespace, "--phase", "halted")
        undolog("show", saga, "-n", namespace)

        banner("A person fixes the Webhook and retries the halted saga")
        fix = json.dumps({"spec": webhook("revoke-permissions", f"{urls['authorization']}/permissions/revoke")["spec"]})
        print(f"$ kubectl patch webhook revoke-permissions -n {namespace} --type=merge -p '{fix}'")
        print(kubectl("patch", "webhook", "revoke-permissions", "-n", namespace, "--type=merge", "-p", fix).rstrip())
        undolog("plan", saga, "-n", namespace)
        undolog("retry", saga, "-n", namespace, "--reason", "fixed the revoke URL")
        print(f"  (the same with kubectl: kubectl annotate saga {saga} undolog.io/retry='fixed the revoke URL')")
        await wait_phase(kube, namespace, saga, "Compensated")
        show("get", "sagas", "-n", namespace)
        left = report(urls)
        if left:
            raise SystemExit(f"something was left behind: {left}")
        print("nothing left behind")
        banner(f"Timeline of {saga}")
        show("describe", "saga", saga, "-n", namespace)
        return saga
    finally:
        await kube.close()


async def run_agent(namespace: str, urls: dict[str, str], email: str) -> str:
    try:
        await onboard(
            email,
            identity=urls["identity"],
            authorization=urls["authorization"],
            mailer=urls["email"],
            namespace=namespace,
        )
    except Exception as error:
        print(f"  the agent failed: {type(error).__name__}; the SDK aborted its saga", flush=True)
    kube = await Kube.connect()
    try:
        sagas = await kube.list("sagas", namespace)
    finally:
        await kube.close()
    newest = max(sagas, key=lambda s: s["metadata"]["creationTimestamp"] + s["metadata"]["name"])
    return str(newest["metadata"]["name"])


def report(urls: dict[str, str]) -> dict[str, Any]:
    return report_states({name: state(url) for name, url in urls.items()})


def report_states(states: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Print what each service holds; returns what was left behind (empty: nothing)."""
    identity, authorization, email = (states[s] for s in ("identity", "authorization", "email"))
    print(f"identity users:        {identity['users']}")
    print(f"authorization grants:  {authorization['permissions']}")
    print(f"email delivered:       {email['delivered']}  recalled: {email['recalled']}")
    left = {"users": identity["users"], "permissions": authorization["permissions"], "emails": email["delivered"]}
    return {k: v for k, v in left.items() if v}


def main() -> None:
    banner("Control plane")
    if os.environ.get("KUBECONFIG"):
        print(f"using KUBECONFIG={os.environ['KUBECONFIG']}")
    else:
        endpoints = LocalControlPlane(ROOT / ".cluster", BIN, durable=True).up()
        verb = "reused" if endpoints.reused else f"started in {endpoints.started_in_seconds:.1f} s"
        print(f"local control plane {verb} at {endpoints.server}")
        os.environ["KUBECONFIG"] = str(endpoints.kubeconfig)
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
    kubectl("wait", "--for=condition=Established", "--timeout=60s", *CRDS)
    namespace = f"undolog-demo-{secrets.token_hex(2)}"
    kubectl("create", "namespace", namespace)
    print(f"CRDs installed; namespace {namespace}")

    *service_ports, liveness = free_ports(4)
    ports = dict(zip(("identity", "authorization", "email"), service_ports, strict=True))
    urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    logs = ROOT / ".cluster" / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "examples.onboarding.services", "--slow-send", "5"]
            + [f"--{name}-port={port}" for name, port in ports.items()],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
        ),
        subprocess.Popen(
            [
                *(sys.executable, "-m", "undolog.cli", "operator", "--namespace", namespace),
                *(f"--liveness-port={liveness}", "--metrics-port=0", f"--leader-election-namespace={namespace}"),
                "--egress-allow-loopback",  # the demo's services listen on loopback
                "--lease-seconds=5",
            ],
            stdout=(logs / "demo-operator.log").open("wb"),
            stderr=subprocess.STDOUT,
        ),
    ]
    try:
        for name in ports:
            wait_http(f"{urls[name]}/state")
        wait_http(f"http://127.0.0.1:{liveness}/healthz")
        print(f"operator running (log: {logs / 'demo-operator.log'}); services at {', '.join(urls.values())}")
        saga = asyncio.run(story(namespace, urls))
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(timeout=30)
    banner("Done: the control plane is still up (`make cluster-down` stops it); look around")
    print(
        f"  export KUBECONFIG={os.environ['KUBECONFIG']}\n"
        f"  export PATH={BIN}:{Path(sys.executable).parent}:$PATH   # kubectl and the undolog command\n"
        f"  undolog list -n {namespace}\n"
        f"  undolog show {saga} -n {namespace}\n"
        f"  kubectl get sagas,undo -n {namespace}\n"
        f"  undolog dashboard   # then open http://127.0.0.1:8000 (namespace {namespace})"
    )


if __name__ == "__main__":
    main()
