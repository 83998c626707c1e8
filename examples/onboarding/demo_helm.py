"""`make demo-helm`: the onboarding story against the operator running as pods.

The chart is installed with `helm install` on the local control plane's node (built by `make
node-up`, image by `make image`); the three services run as a pod behind a Service, and the saga
is applied with kubectl, so the operator's pods run its steps and undo them:
1. the email provider answers too late: the pods undo the saga newest first, nothing is left;
2. the revoke endpoint is misconfigured: the saga halts; a person fixes it and retries.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import yaml

from examples.onboarding import in_cluster
from examples.onboarding.demo import banner, report_states, show, wait_phase
from undolog.kube import Kube

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("UNDOLOG_BIN_DIR", ROOT / "bin"))
NAMESPACE, RELEASE_NAMESPACE = "onboarding", "undolog-system"


def kubectl(*args: str, stdin: str | None = None) -> str:
    done = subprocess.run([str(BIN / "kubectl"), *args], input=stdin, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def apply_saga(name: str) -> None:
    manifest = yaml.safe_load((in_cluster.HERE / "saga.yaml").read_text())
    manifest["metadata"]["name"] = name
    print(f"$ kubectl apply -n {NAMESPACE} -f saga.yaml   # as {name}")
    kubectl("apply", "-n", NAMESPACE, "-f", "-", stdin=yaml.safe_dump(manifest))


def left_behind() -> dict[str, object]:
    return report_states(in_cluster.services_state(kubectl, NAMESPACE))


async def story() -> None:
    kube = await Kube.connect()
    try:
        banner("Run 1: onboard ada@example.com; the email provider answers too late")
        apply_saga("onboard-ada")
        done = await wait_phase(kube, NAMESPACE, "onboard-ada", "Compensated")
        print(f"saga onboard-ada: {done['status']['phase']} ({done['status']['message']})")
        show("get", "sagas,undo", "-n", NAMESPACE, "-o", "wide")
        if left := left_behind():
            raise SystemExit(f"something was left behind: {left}")
        leader = kubectl(
            "get", "lease", "undolog-operator", "-n", RELEASE_NAMESPACE, "-o", "jsonpath={.spec.holderIdentity}"
        )
        print(f"\n$ kubectl logs -n {RELEASE_NAMESPACE} {leader} | grep onboard-ada   # the leader did it")
        lines = [
            line for line in kubectl("logs", "-n", RELEASE_NAMESPACE, leader).splitlines() if "onboard-ada" in line
        ]
        print("\n".join(lines[-8:]))

        banner("Run 2: the revoke endpoint is misconfigured (404): the saga halts for a person")
        address = kubectl("get", "service", "onboarding-services", "-n", NAMESPACE, "-o", "jsonpath={.spec.clusterIP}")
        broken = f"http://{address}:8102/permissions/revoke-everything"
        kubectl("patch", "webhook", "revoke-permissions", "-n", NAMESPACE, "--type=json", "-p",
                f'[{{"op": "replace", "path": "/spec/versions/0/url", "value": "{broken}"}}]')  # fmt: skip
        apply_saga("onboard-grace")
        halted = await wait_phase(kube, NAMESPACE, "onboard-grace", "Halted")
        show("get", "sagas", "-n", NAMESPACE, "-l", "undolog.io/phase=halted")
        print(f"\nwhy: {halted['status']['message']}")

        banner("A person fixes the Webhook and retries the halted saga")
        kubectl("apply", "-n", NAMESPACE, "-f", "-", stdin=in_cluster.webhooks(address))
        print(f"$ kubectl annotate saga onboard-grace undolog.io/retry='fixed the revoke URL' -n {NAMESPACE}")
        kubectl("annotate", "saga", "onboard-grace", "undolog.io/retry=fixed the revoke URL", "-n", NAMESPACE)
        await wait_phase(kube, NAMESPACE, "onboard-grace", "Compensated")
        show("get", "sagas", "-n", NAMESPACE)
        if left := left_behind():
            raise SystemExit(f"something was left behind: {left}")
        print("nothing left behind")
        banner("Timeline of onboard-grace")
        show("describe", "saga", "onboard-grace", "-n", NAMESPACE)
    finally:
        await kube.close()


def main() -> None:
    kubeconfig = Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / ".cluster-node" / "kubeconfig").resolve()
    os.environ["KUBECONFIG"] = str(kubeconfig)
    try:
        run()
    except RuntimeError as error:
        raise SystemExit(f"error: {error}") from error
    banner("Done")
    print(f"export KUBECONFIG={kubeconfig}; `make node-down` stops the node and the control plane.")


def run() -> None:
    banner("The operator, installed with Helm on the local node")
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))  # as `make demo` leaves them
    installed = subprocess.run(
        [str(BIN / "helm"), "upgrade", "--install", "undolog", str(ROOT / "charts" / "undolog"), "-n",
         RELEASE_NAMESPACE, "--create-namespace", "--take-ownership", "--wait", "--timeout=3m"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if installed.returncode != 0:
        raise SystemExit(f"helm install: {installed.stderr.strip()}")
    show("get", "pods", "-n", RELEASE_NAMESPACE, "-o", "wide")
    kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait")  # a fresh story each run
    kubectl("create", "namespace", NAMESPACE)
    address = in_cluster.deploy_services(kubectl, NAMESPACE)
    kubectl("apply", "-n", NAMESPACE, "-f", "-", stdin=in_cluster.webhooks(address))
    print(f"the services run as a pod behind {address}; their Webhooks:")
    show("get", "webhooks", "-n", NAMESPACE)
    asyncio.run(story())


if __name__ == "__main__":
    main()
