"""kopf runs the process's frame (signals, the liveness endpoint) and, with several shards,
watches the Sagas and UndoEntries that have no bucket label (a server-side label selector), so
that they are filed into their bucket; each shard's engine watches its own buckets itself.

Only kopf's event handlers are used: they write nothing to the objects (no progress or
diff-base annotations, no kopf finalizer), so the CRDs' status holds UndoLog's fields alone.
kopf logs in with exactly the credentials of UndoLog's own client, and uses its timeouts.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import kopf

from undolog.api import GROUP, VERSION
from undolog.api.common import Plural
from undolog.conventions import BUCKET_LABEL
from undolog.kube.client import Body, Kube

Unfiled = Callable[[Plural, Body], None]  # an object without a bucket label


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


class NoDiffBase(kopf.DiffBaseStorage):
    """Event handlers need no diff base; kopf would still deep-copy every body to build one."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        raise AssertionError("UndoLog registers no change handlers, so kopf never stores a diff base")


def registry(kube: Kube, unfiled: Unfiled | None, cleanup: Callable[[], Awaitable[None]]) -> kopf.OperatorRegistry:
    handlers = kopf.OperatorRegistry()
    timeouts = kube.timeouts

    @kopf.on.startup(registry=handlers)
    async def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.posting.enabled = False  # UndoLog posts its own Events (controller.timeline)
        settings.watching.server_timeout = timeouts.watch  # reconnect streams that go quiet (kopf #1276)
        settings.watching.client_timeout = timeouts.watch_client
        settings.watching.connect_timeout = timeouts.connect
        settings.networking.request_timeout = timeouts.request
        settings.persistence.diffbase_storage = NoDiffBase()
        for plural in ("sagas", "undoentries"):
            settings.watching.label_selectors[GROUP, plural] = f"!{BUCKET_LABEL}"

    @kopf.on.login(registry=handlers)
    async def login(**_: Any) -> kopf.ConnectionInfo:
        return await connection_info(kube)

    @kopf.on.cleanup(registry=handlers)
    async def stop(**_: Any) -> None:
        await cleanup()

    if unfiled is not None:
        register_unfiled(handlers, "sagas", unfiled)
        register_unfiled(handlers, "undoentries", unfiled)

    return handlers


def register_unfiled(handlers: kopf.OperatorRegistry, plural: Plural, unfiled: Unfiled) -> None:
    @kopf.on.event(GROUP, VERSION, plural, registry=handlers)
    async def changed(event: kopf.RawEvent, **_: Any) -> None:
        if event.get("type") != "DELETED":
            unfiled(plural, dict(event["object"]))


async def run_kopf(
    kube: Kube,
    namespaces: list[str],
    liveness_port: int | None,
    unfiled: Unfiled | None,
    cleanup: Callable[[], Awaitable[None]],
) -> None:
    """Run until the process is told to stop (SIGTERM, SIGINT); then `cleanup`, before kopf
    looks for tasks left running."""
    await kopf.operator(
        registry=registry(kube, unfiled, cleanup),
        clusterwide=not namespaces,
        namespaces=namespaces,
        liveness_endpoint=f"http://0.0.0.0:{liveness_port}/healthz" if liveness_port else None,
        standalone=True,
    )
