"""Namespaces the tests make, deleted so that they go."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from undolog.conventions import FINALIZER
from undolog.errors import NotFound
from undolog.kube import Kube


@asynccontextmanager
async def fresh_namespace(kube: Kube, name: str | None = None) -> AsyncIterator[str]:
    """A namespace made for the block (named `name`, or a fresh `t-` name), deleted after it."""
    name = name or f"t-{uuid.uuid4().hex[:10]}"
    await kube.create_namespace(name, {})
    try:
        yield name
    finally:
        await delete_releasing_sagas(kube, name)


async def delete_releasing_sagas(kube: Kube, name: str) -> None:
    """`name` deleted once its sagas' finalizers are released. The operator that would have
    compensated them has stopped, and a saga that keeps its finalizer keeps the namespace
    Terminating: the namespace controller then sweeps it again every few seconds until the
    control plane stops (about 180 requests a second to each session's apiserver with 20 such
    namespaces, measured in a full run), which slows every test after it."""
    for saga in await kube.list("sagas", name):
        if FINALIZER in saga["metadata"].get("finalizers", []):
            with contextlib.suppress(NotFound):  # gone meanwhile
                await kube.patch("sagas", name, saga["metadata"]["name"], {"metadata": {"finalizers": None}})
    await kube.delete_namespace(name)
