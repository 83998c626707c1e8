"""Reads and conditional writes of Sagas and UndoEntries.

Every write carries the resourceVersion it was decided from, so a stale writer (an older
operator instance, a decision made on an old copy) gets 409 Conflict and decides again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from undolog.api.saga import SagaStatus
from undolog.kube import Body, Kube, Plural

MAX_OUTPUT_BYTES = 16 * 1024


def key_of(body: Body) -> tuple[str, str]:
    meta = body["metadata"]
    return meta["namespace"], meta["name"]


def conditional(body: Body, patch: Body) -> Body:
    """`patch` made conditional on the body's resourceVersion."""
    metadata = {**patch.get("metadata", {}), "resourceVersion": body["metadata"]["resourceVersion"]}
    return {**patch, "metadata": metadata}


def capped_output(output: dict[str, Any] | None) -> dict[str, Any] | None:
    """The forward output as stored: replaced by a marker when too large for the ledger."""
    if output is None:
        return None
    size = len(json.dumps(output, separators=(",", ":")).encode())
    if size > MAX_OUTPUT_BYTES:
        return {"undologTruncated": True, "sizeBytes": size}
    return output


@dataclass
class Ledger:
    kube: Kube

    async def saga(self, namespace: str, name: str) -> Body:
        return await self.kube.get("sagas", namespace, name)

    async def entries(self, namespace: str, saga: str) -> list[Body]:
        """A saga's entries, listed consistently (a scan of the namespace's entries: costly at scale)."""
        return await self.kube.list("undoentries", namespace, field_selector=f"spec.saga={saga}")

    async def write_saga_status(self, saga: Body, status: SagaStatus) -> Body:
        # Full status with explicit nulls: a merge patch then clears what the new status drops.
        patch = {"status": status.model_dump(mode="json", by_alias=True)}
        return await self.kube.patch_status("sagas", *key_of(saga), conditional(saga, patch))

    async def write_saga_metadata(
        self, saga: Body, *, labels: dict[str, str | None] | None = None, finalizers: list[str] | None = None
    ) -> Body:
        metadata: Body = {}
        if labels:
            metadata["labels"] = labels
        if finalizers is not None:
            metadata["finalizers"] = finalizers
        return await self.kube.patch("sagas", *key_of(saga), conditional(saga, {"metadata": metadata}))

    async def write_entry_status(self, entry: Body, changes: Body) -> Body:
        return await self.kube.patch_status("undoentries", *key_of(entry), conditional(entry, {"status": changes}))

    async def drop_annotation(self, plural: Plural, body: Body, key: str) -> Body:
        return await self.kube.patch(
            plural, *key_of(body), conditional(body, {"metadata": {"annotations": {key: None}}})
        )
