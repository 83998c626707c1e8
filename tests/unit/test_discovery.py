"""Naming an object as kubectl does: the API's discovery, read once per API server for the
process, and read again when a name is not in it (a CRD installed since)."""

from __future__ import annotations

from typing import Any, cast

from undolog.kube import Kube
from undolog.kube.objects import Discovery


class Served:
    """An API server's discovery, counting its reads."""

    def __init__(self, server: str) -> None:
        self.server, self.reads = server, 0
        self.groups: dict[str, list[dict[str, Any]]] = {
            "v1": [
                {
                    "name": "configmaps",
                    "singularName": "configmap",
                    "kind": "ConfigMap",
                    "namespaced": True,
                    "shortNames": ["cm"],
                }
            ],
            "apps/v1": [
                {"name": "deployments", "singularName": "deployment", "kind": "Deployment", "namespaced": True},
                {"name": "deployments/scale", "kind": "Scale", "namespaced": True},
            ],
        }

    async def request(self, method: str, path: str) -> dict[str, Any]:
        self.reads += 1
        if path == "/apis":
            versions = [v for v in self.groups if "/" in v]
            return {"groups": [{"preferredVersion": {"groupVersion": v}} for v in versions]}
        return {"resources": self.groups[path.removeprefix("/apis/").removeprefix("/api/")]}


async def test_readers_of_one_server_share_its_discovery_and_a_new_name_is_looked_for_again() -> None:
    api = Served("https://127.0.0.1:1")
    first = await Discovery(cast(Kube, api)).resolve("cm", "shop", "settings")
    assert (first.api_version, first.resource, first.namespace) == ("v1", "configmaps", "shop")
    reads = api.reads
    second = await Discovery(cast(Kube, api)).resolve(
        "deployments.apps", None, "web"
    )  # another reader, e.g. an SDK step
    assert (second.api_version, second.kind, second.namespace) == ("apps/v1", "Deployment", "default")
    assert api.reads == reads  # not read again
    api.groups["example.io/v1"] = [{"name": "widgets", "kind": "Widget", "namespaced": False}]
    widget = await Discovery(cast(Kube, api)).resolve("widget", "shop", "w")  # installed since: read again
    assert (widget.api_version, widget.namespace) == ("example.io/v1", None)
