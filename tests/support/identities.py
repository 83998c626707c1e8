"""Kubeconfigs for other identities: a ServiceAccount's token (TokenRequest API), so a test can
run a process with exactly the permissions that account's RBAC grants; and which identity
holds a Lease."""

from __future__ import annotations

from pathlib import Path

import yaml

from undolog.errors import NotFound
from undolog.kube import Kube


async def service_account_kubeconfig(
    kube: Kube, admin_kubeconfig: Path, namespace: str, account: str, target: Path, create: bool = True
) -> Path:
    """A kubeconfig that authenticates as system:serviceaccount:<namespace>:<account>."""
    if create:
        await create_service_account(kube, namespace, account)
    token = await service_account_token(kube, namespace, account)
    return write_token_kubeconfig(admin_kubeconfig, namespace, account, token, target)


async def lease_holder(kube: Kube, namespace: str, name: str) -> str:
    """The identity holding the Lease ('' when it is free or does not exist)."""
    try:
        lease = await kube.get_lease(namespace, name)
    except NotFound:
        return ""
    return str((lease.get("spec") or {}).get("holderIdentity") or "")


async def create_service_account(kube: Kube, namespace: str, account: str) -> None:
    body = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account}}
    await kube.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts", body)


async def service_account_token(kube: Kube, namespace: str, account: str) -> str:
    """An hour's token for the account (TokenRequest API)."""
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}}
    path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token"
    return str((await kube.request("POST", path, request))["status"]["token"])


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
