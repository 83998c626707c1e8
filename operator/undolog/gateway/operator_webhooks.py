"""The Webhooks that lead the operator to the compensations the gateway serves it
(operator_calls.py): one for each, named as the compensation names it (`mcp: {tool: ...}`,
signed with `operatorCalls.signingSecret`), pointing at `operatorCalls.url`. One of that name
that the gateway did not make is left as it is (said in the log)."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from undolog.api.common import API_VERSION
from undolog.api.gateway import GatewayConfig
from undolog.errors import AlreadyExists, NotFound
from undolog.gateway.operator_calls import MANAGED_BY, Served
from undolog.kube import Kube

log = logging.getLogger("undolog.gateway")


class OperatorWebhooks:
    def __init__(self, config: GatewayConfig, tools: dict[str, dict[str, Served]], kube: Kube) -> None:
        self.config, self.tools, self.kube = config, tools, kube

    async def publish(self) -> None:
        """A Webhook for each compensation served here, pointing at this gateway; one that exists
        and is not the gateway's is left as it is (said in the log)."""
        url = self.config.operator_calls.url
        if url is None:
            if self.tools:
                log.warning("operatorCalls.url is not set: make the Webhooks of %s yourself", self._names())
            return
        for upstream, tools in self.tools.items():
            for tool, served in tools.items():
                await self._keep(
                    served.webhook, self._webhook(f"{url.rstrip('/')}/upstreams/{upstream}/mcp", tool, served)
                )

    def _names(self) -> str:
        return ", ".join(sorted(s.webhook for tools in self.tools.values() for s in tools.values()))

    def _webhook(self, url: str, tool: str, served: Served) -> dict[str, Any]:
        spec: dict[str, Any] = {"versions": [{"name": served.version, "url": url, "mcp": {"tool": tool}}]}
        if self.config.operator_calls.signing_secret:
            spec["signing"] = {"secretRef": {"name": self.config.operator_calls.signing_secret}}
        metadata = {"name": served.webhook, "labels": dict([MANAGED_BY])}
        return {"apiVersion": API_VERSION, "kind": "Webhook", "metadata": metadata, "spec": spec}

    async def _keep(self, name: str, body: dict[str, Any]) -> None:
        namespace = self.config.namespace
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
