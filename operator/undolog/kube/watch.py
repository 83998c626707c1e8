"""A watch applied in the stream's order: one consistent LIST, then every change after it.

kopf hands each object's events to a worker of its own, so across objects they reach handlers
in no fixed order; UndoEntries are watched here instead, one stream per watched namespace (or
one for all), each event delivered before the next is read.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from undolog import errors
from undolog.api.common import Plural, revision_of
from undolog.kube.client import Body, Kube

log = logging.getLogger("undolog.watch")
RETRY_CAP_SECONDS = 2.0  # after an outage the stream is back within this of the API


@dataclass
class Progress:
    """How far a watch has applied its stream: every change of a watched object up to `revision`
    has been handed over (a listing, then events and bookmarks in revision order)."""

    revision: int = 0
    _waiting: list[tuple[int, int, asyncio.Future[None]]] = field(default_factory=list)  # a heap
    _order: itertools.count[int] = field(default_factory=itertools.count)

    def advance(self, version: str) -> None:
        revision = revision_of(version)
        if revision is None or revision <= self.revision:
            return
        self.revision = revision
        while self._waiting and self._waiting[0][0] <= revision:
            waiter = heapq.heappop(self._waiting)[2]
            if not waiter.done():
                waiter.set_result(None)

    async def reached(self, revision: int, within: float) -> bool:
        """Whether the stream reaches `revision` within `within` seconds."""
        if revision <= self.revision:
            return True
        waiter = asyncio.get_running_loop().create_future()
        mark = (revision, next(self._order), waiter)
        heapq.heappush(self._waiting, mark)
        try:
            async with asyncio.timeout(within):
                await waiter
            return True
        except TimeoutError:
            return False
        finally:
            if mark in self._waiting:  # given up on (or cancelled): never kept by a stalled stream
                self._waiting.remove(mark)
                heapq.heapify(self._waiting)


T = TypeVar("T")


def as_body(body: Body) -> Body:
    return body


@dataclass
class OrderedWatch(Generic[T]):
    kube: Kube
    plural: Plural
    namespace: str | None  # None: all namespaces
    parse: Callable[[Body], T]  # each object once, as it arrives (a listing page by page)
    deliver: Callable[[str, T], None]  # each event, in order: ADDED, MODIFIED or DELETED
    relisted: Callable[[list[T]], None]  # a fresh consistent listing (at start, and after a 410)
    label_selector: str | None = None
    relist: Callable[[], Awaitable[object]] | None = None  # after a 410 (None: `sync`)
    news: Callable[[str, Body], bool] = lambda kind, body: True  # False: an event not parsed nor delivered
    version: str = ""  # the revision the stream has reached
    progress: Progress = field(default_factory=Progress)  # how far what it handed over reaches

    async def sync(self) -> list[T]:
        """List consistently and hand the listing over; returns it."""
        items = await self.listing()
        self.handed(items)
        return items

    async def listing(self) -> list[T]:
        """List consistently; the stream follows from there once the listing is `handed` over."""
        return [item async for page in self.pages() for item in page]

    async def pages(self) -> AsyncIterator[list[T]]:
        """A consistent listing, page by page; the stream follows from where it ends."""
        version = ""
        async for page, at in self.kube.list_pages(self.plural, self.namespace, label_selector=self.label_selector):
            version = version or at
            yield [self.parse(body) for body in page]
        self.version = version

    def handed(self, items: list[T]) -> None:
        self.relisted(items)
        self.progress.advance(self.version)

    async def run(self) -> None:
        """Follow the stream from where `sync` left it (or list first, never listed), forever:
        resume after the apiserver closes it, list again when the revision is too old to resume
        from."""
        failures = 0
        expired = not self.version
        while True:
            try:
                if expired:
                    await (self.relist or self.sync)()
                    expired = False
                async for kind, body in self.kube.watch(
                    self.plural, self.namespace, self.version, label_selector=self.label_selector
                ):
                    failures = 0
                    if kind in ("ADDED", "MODIFIED", "DELETED"):
                        self.apply(kind, body)
                    self.version = body["metadata"]["resourceVersion"]
                    self.progress.advance(self.version)
            except errors.Gone:
                expired = True
            except errors.KubeError as error:
                failures += 1
                log.warning("the %s watch broke (%s); watching again", self.plural, error.message)
            if failures:
                await asyncio.sleep(min(RETRY_CAP_SECONDS, 0.1 * 2**failures))

    def apply(self, kind: str, body: Body) -> None:
        """One event; one that cannot be handled is logged, never the end of the watch."""
        try:
            if self.news(kind, body):
                self.deliver(kind, self.parse(body))
        except Exception:
            meta = body.get("metadata", {})
            log.exception("the %s event of %s %s/%s could not be handled", kind, self.plural, *named(meta))


def named(meta: Body) -> tuple[str, str]:
    return meta.get("namespace", ""), meta.get("name", "")
