"""Kubeconfigs for other identities: a ServiceAccount's token (TokenRequest API), so a test can
run a process with exactly the permissions that account's RBAC grants."""

from __future__ import annotations

from pathlib import Path

import yaml
from kubernetes_asyncio import client

from undolog.kube import Kube


async def service_account_kubeconfig(
    kube: Kube, admin_kubeconfig: Path, namespace: str, account: str, target: Path, create: bool = True
) -> Path:
    """A kubeconfig that authenticates as system:serviceaccount:<namespace>:<account>."""
    core = client.CoreV1Api(kube.api)
    if create:
        await core.create_namespaced_service_account(
            namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=account))
        )
    request = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600))
    token = await core.create_namespaced_service_account_token(account, namespace, request)
    return write_token_kubeconfig(admin_kubeconfig, namespace, account, token.status.token, target)


def write_token_kubeconfig(admin_kubeconfig: Path, namespace: str, account: str, token: str, target: Path) -> Path:
    admin = yaml.safe_load(admin_kubeconfig.read_text())
    context = next(c for c in admin["contexts"] if c["name"] == admin["current-context"])["context"]
    cluster = next(c for c in admin["clusters"] if c["name"] == context["cluster"])
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [cluster],
        "users": [{"name": account, "user": {"token": token}}],
        "contexts": [
            {"name": account, "context": {"cluster": cluster["name"], "user": account, "namespace": namespace}}
        ],
        "current-context": account,
    }
    target.write_text(yaml.safe_dump(config))
    return target
