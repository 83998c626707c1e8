"""A gateway configuration for unit tests of its decisions: one upstream on loopback, anyone may
call (`auth: none`), the fields under test on top."""

from __future__ import annotations

from typing import Any

from undolog.api.gateway import GatewayConfig

UPSTREAMS = {"tracker": {"url": "http://127.0.0.1:1/mcp"}}


def settings(**fields: Any) -> GatewayConfig:
    return GatewayConfig.model_validate({"namespace": "agents", "auth": "none", "upstreams": UPSTREAMS, **fields})
