"""kopf runs the process's frame: signals, the liveness endpoint, log formats, the login.

It handles no resource: each shard's engine watches its own Sagas and UndoEntries, and the
objects without a bucket label are watched by `controller.shard_labels`. So kopf writes
nothing to the objects (no progress or diff-base annotations, no kopf finalizer), and the
CRDs' status holds UndoLog's fields alone. kopf logs in with exactly the credentials of
UndoLog's own client, and uses its timeouts.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import kopf

from undolog.kube.client import Kube


def configure_logging(log_format: str, verbose: bool) -> None:
    """plain, full or json log lines (kopf's formats, which UndoLog's own loggers use too)."""
    formats = {"plain": kopf.LogFormat.PLAIN, "full": kopf.LogFormat.FULL, "json": kopf.LogFormat.JSON}
    kopf.configure(verbose=verbose, log_format=formats[log_format])


async def connection_info(kube: Kube) -> kopf.ConnectionInfo:
    """kopf asks again when its credentials expire or the API answers 401."""
    found = kube.credentials
    token, issued = await kube.fresh_credentials()
    certificate = (issued.certificate_data if issued else None) or found.certificate_data
    key = (issued.key_data if issued else None) or found.key_data
    expires = issued.expires if issued else None
    return kopf.ConnectionInfo(
        server=found.server,
        ca_path=None if found.ca_data else found.ca_file,
        ca_data=found.ca_data,
        insecure=found.insecure,
        certificate_path=None if certificate else found.certificate_file,
        certificate_data=certificate,
        private_key_path=None if key else found.key_file,
        private_key_data=key,
        token=token,
        expiration=datetime.fromtimestamp(expires, UTC) if expires is not None else None,
    )


def registry(kube: Kube, cleanup: Callable[[], Awaitable[None]]) -> kopf.OperatorRegistry:
    handlers = kopf.OperatorRegistry()
    timeouts = kube.timeouts

    @kopf.on.startup(registry=handlers)
    async def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.posting.enabled = False  # UndoLog posts its own Events (controller.timeline)
        settings.watching.server_timeout = timeouts.watch  # reconnect streams that go quiet (kopf #1276)
        settings.watching.client_timeout = timeouts.watch_client
        settings.watching.connect_timeout = timeouts.connect
        settings.networking.request_timeout = timeouts.request

    @kopf.on.login(registry=handlers)
    async def login(**_: Any) -> kopf.ConnectionInfo:
        return await connection_info(kube)

    @kopf.on.cleanup(registry=handlers)
    async def stop(**_: Any) -> None:
        await cleanup()

    return handlers


async def run_kopf(
    kube: Kube,
    namespaces: list[str],
    liveness_port: int | None,
    cleanup: Callable[[], Awaitable[None]],
) -> None:
    """Run until the process is told to stop (SIGTERM, SIGINT); then `cleanup`, before kopf
    looks for tasks left running."""
    await kopf.operator(
        registry=registry(kube, cleanup),
        clusterwide=not namespaces,
        namespaces=namespaces,
        liveness_endpoint=f"http://0.0.0.0:{liveness_port}/healthz" if liveness_port else None,
        standalone=True,
    )
