"""The Webhooks that lead the operator to the compensations the gateway serves it
(operator_calls.py): one for each, named as the compensation names it (`mcp: {tool: ...}`,
signed with `operatorCalls.signingSecret`), pointing at `operatorCalls.url`, in the gateway's
namespace at start and in each other namespace before the gateway opens its first saga there
(the operator calls only Webhooks of the saga's namespace), with a copy of the signing Secret's
keys beside them (a Webhook names a Secret of its own namespace). One of that name that the
gateway did not make is left as it is (said in the log)."""

from __future__ import annotations

import base64
import contextlib
import logging
from typing import Any

from undolog.api.common import API_VERSION
from undolog.api.gateway import GatewayConfig
from undolog.conventions import HEADERS_SECRET_LABEL
from undolog.errors import AlreadyExists, KubeError, NotFound, UndoLogError
from undolog.gateway.operator_calls import MANAGED_BY, Served
from undolog.kube import Kube
from undolog.kube.client import MERGE_PATCH

log = logging.getLogger("undolog.gateway")


class WebhooksRefused(UndoLogError):
    """The gateway cannot keep its Webhooks in a namespace: its undo could not be called there."""


class OperatorWebhooks:
    def __init__(self, config: GatewayConfig, tools: dict[str, dict[str, Served]], kube: Kube) -> None:
        self.config, self.tools, self.kube = config, tools, kube
        self.kept: set[str] = set()  # the namespaces whose Webhooks this replica has kept

    async def serve_in(self, namespace: str) -> None:
        """The Webhooks (and the signing keys) in `namespace`, once per replica; WebhooksRefused
        saying why they cannot be kept there."""
        if namespace in self.kept or not self.tools:
            return
        url = self.config.operator_calls.url
        if url is None:
            log.warning(
                "operatorCalls.url is not set: make the Webhooks of %s in %s yourself", self._names(), namespace
            )
            self.kept.add(namespace)
            return
        try:
            if namespace != self.config.namespace:
                await self._signing_keys_in(namespace)
            for upstream, tools in self.tools.items():
                for tool, served in tools.items():
                    body = self._webhook(f"{url.rstrip('/')}/upstreams/{upstream}/mcp", tool, served)
                    await self._keep(namespace, served.webhook, body)
        except KubeError as error:
            raise WebhooksRefused(
                f"the gateway cannot keep the Webhooks of its compensations ({self._names()}) in namespace "
                f"{namespace}, so their undo could not be called there: {error}"
            ) from None
        self.kept.add(namespace)

    async def _signing_keys_in(self, namespace: str) -> None:
        """A copy of the signing Secret's keys in `namespace`, under its name."""
        name = self.config.operator_calls.signing_secret
        if name is None:
            return
        _, data = await self.kube.secret(self.config.namespace, name)
        encoded = {key: base64.b64encode(value).decode() for key, value in data.items()}
        labels = {HEADERS_SECRET_LABEL: "true", MANAGED_BY[0]: MANAGED_BY[1]}
        body = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "labels": labels}, "data": encoded}
        path = f"/api/v1/namespaces/{namespace}/secrets"
        try:
            await self.kube.request("POST", path, body)
        except AlreadyExists:
            await self.kube.request("PATCH", f"{path}/{name}", {"data": encoded}, content_type=MERGE_PATCH)

    def _names(self) -> str:
        return ", ".join(sorted(s.webhook for tools in self.tools.values() for s in tools.values()))

    def _webhook(self, url: str, tool: str, served: Served) -> dict[str, Any]:
        spec: dict[str, Any] = {"versions": [{"name": served.version, "url": url, "mcp": {"tool": tool}}]}
        if self.config.operator_calls.signing_secret:
            spec["signing"] = {"secretRef": {"name": self.config.operator_calls.signing_secret}}
        metadata = {"name": served.webhook, "labels": dict([MANAGED_BY])}
        return {"apiVersion": API_VERSION, "kind": "Webhook", "metadata": metadata, "spec": spec}

    async def _keep(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        try:
            existing = await self.kube.get("webhooks", namespace, name)
        except NotFound:
            with contextlib.suppress(AlreadyExists):  # another replica made it first
                await self.kube.create("webhooks", namespace, body)
            return
        labels = existing["metadata"].get("labels") or {}
        if labels.get(MANAGED_BY[0]) != MANAGED_BY[1]:
            log.warning("Webhook %s/%s exists and is not the gateway's: left as it is", namespace, name)
            return
        await self.kube.patch("webhooks", namespace, name, {"spec": body["spec"]})
