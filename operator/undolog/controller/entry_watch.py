"""The operator's own watch of UndoEntries: the entry index is fed in the stream's order.

kopf hands each object's events to a worker of its own, so across objects they reach
handlers in no fixed order; an entry created before its saga's abort could then be applied
after a later entry's event had already vouched for the index's completeness, and the saga
would be compensated without it (out of LIFO order). So entries are watched here, one stream
per watched namespace (or one for all), each event applied before the next is read.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

from undolog.controller.entry_index import EntryIndex
from undolog.kube import ApiException, Body, Kube

log = logging.getLogger("undolog.entries")
RETRY_CAP_SECONDS = 30.0


@dataclass
class EntryWatch:
    kube: Kube
    index: EntryIndex
    deliver: Callable[[str, Body], None]  # each event, in order (the engine's entry_event)
    namespace: str | None  # None: all namespaces
    version: str = ""  # the revision the stream has reached

    async def sync(self) -> list[Body]:
        """List consistently and load the index. Entries it held that the listing lacks were
        deleted while no stream was open: they are delivered as deletions (so a pending one is
        reported on its saga). Returns the listing."""
        items, version = await self.kube.list_versioned("undoentries", self.namespace)
        listed = {named(b) for b in items}
        vanished = [b for b in self.index.held(self.namespace) if named(b) not in listed]
        self.index.prime(items, version, self.namespace)
        for body in vanished:
            self.apply("DELETED", body)
        self.version = version
        return items

    async def run(self) -> None:
        """Follow the stream from where `sync` left it, forever: resume after the apiserver
        closes it, list again when the revision is too old to resume from."""
        failures = 0
        expired = False
        while True:
            try:
                if expired:
                    for body in await self.sync():
                        self.apply("MODIFIED", body)  # wakes the sagas whose entries changed unseen
                    expired = False
                async for kind, body in self.kube.watch("undoentries", self.namespace, self.version):
                    failures = 0
                    if kind == "BOOKMARK":
                        self.index.reached(self.namespace, body["metadata"]["resourceVersion"])
                    else:
                        self.apply(kind, body)
                    self.version = body["metadata"]["resourceVersion"]
            except ApiException as error:
                expired = error.status == 410
                if not expired:
                    failures += 1
                    log.warning("watching undo entries failed (%s %s); watching again", error.status, error.reason)
            except (aiohttp.ClientError, TimeoutError, OSError) as error:
                failures += 1
                log.warning("the undo entry watch broke (%s); watching again", error or type(error).__name__)
            if failures:
                await asyncio.sleep(min(RETRY_CAP_SECONDS, 0.25 * 2**failures))

    def apply(self, kind: str, body: Body) -> None:
        """One event; one that cannot be handled is logged, never the end of the watch."""
        try:
            self.deliver(kind, body)
        except Exception:
            log.exception("the %s event of undo entry %s/%s could not be handled", kind, *named(body))


def named(body: Body) -> tuple[str, str]:
    return body["metadata"]["namespace"], body["metadata"]["name"]
