"""Files sagas and entries into their bucket (label `undolog.io/bucket`) when they arrive
without it (applied with kubectl, made before there were shards) or with a wrong one (edited
by hand): a replica lists and watches only its shards' labels, so an object without the right
one would be driven by nobody. The SDK and the operator label what they create; this is for
the rest. Any replica may do it (the same label whoever writes it): each watches the objects
whose label is no bucket at all (`notin` every bucket: missing, `64`, `07`, `none`), and each
shard refiles what it sees labelled into it by mistake.

UndoLog's own watch, not kopf's: kopf parses with Python's json, whose RecursionError on an
object nested as deep as the API stores ended kopf's watcher and with it the operator process,
so one such object applied by hand kept every replica in a crash loop."""

from __future__ import annotations

import asyncio
import functools
import logging
from dataclasses import dataclass, field

from undolog import errors
from undolog.api import UndoEntry
from undolog.conventions import BUCKET_LABEL, BUCKETS
from undolog.decisions.sharding import Shard
from undolog.kube import Body, Kube, Plural
from undolog.kube.watch import OrderedWatch, as_body
from undolog.ledger import Ledger

log = logging.getLogger("undolog.shard_labels")
RETRY_CAP_SECONDS = 2.0

Filed = tuple[Plural, str, str]  # plural, namespace, name


@dataclass
class ShardLabels:
    ledger: Ledger
    filing: dict[Filed, asyncio.Task[None]] = field(default_factory=dict)

    def file(self, plural: Plural, namespace: str, name: str, saga: str) -> None:
        """Label the object with its saga's bucket, in the background, until it is done or the
        object is gone (once per object at a time)."""
        key = (plural, namespace, name)
        if key not in self.filing:
            self.filing[key] = asyncio.create_task(self._file(key, saga), name=f"filing {plural} {namespace}/{name}")

    async def _file(self, key: Filed, saga: str) -> None:
        failures = 0
        try:
            while True:
                try:
                    await self.ledger.file_in_bucket(*key, saga)
                    return
                except errors.NotFound:
                    return
                except errors.KubeError as error:
                    failures += 1
                    log.warning("could not label %s %s/%s with its bucket: %s", *key, error.message)
                await asyncio.sleep(min(RETRY_CAP_SECONDS, 0.1 * 2**failures))
        finally:
            del self.filing[key]

    async def stop(self) -> None:
        for task in list(self.filing.values()):
            task.cancel()
        await asyncio.gather(*self.filing.values(), return_exceptions=True)


def unfiled_watches(kube: Kube, labels: ShardLabels, namespaces: list[str]) -> list[OrderedWatch[Body]]:
    """Watches of the Sagas and UndoEntries in no bucket in `namespaces` (all when empty), each
    object filed as it is listed or changes; run them with `OrderedWatch.run`."""

    def file(plural: Plural, body: Body) -> None:
        meta = body["metadata"]
        saga = meta["name"] if plural == "sagas" else (body.get("spec") or {}).get("saga")
        if isinstance(saga, str) and saga:
            labels.file(plural, meta["namespace"], meta["name"], saga)

    def changed(plural: Plural, kind: str, body: Body) -> None:
        if kind != "DELETED":
            file(plural, body)

    def listed(plural: Plural, bodies: list[Body]) -> None:
        for body in bodies:
            file(plural, body)

    plurals: tuple[Plural, ...] = ("sagas", "undoentries")
    targets: list[str | None] = [*namespaces] or [None]
    return [
        OrderedWatch(
            kube,
            plural,
            namespace,
            as_body,
            functools.partial(changed, plural),
            functools.partial(listed, plural),
            label_selector=f"{BUCKET_LABEL} notin ({','.join(str(b) for b in range(BUCKETS))})",
        )
        for plural in plurals
        for namespace in targets
    ]


def filed_in(shard: Shard, labels: ShardLabels | None, entry: UndoEntry) -> bool:
    """Whether the entry belongs to `shard`; one labelled into it by hand is filed where it belongs."""
    meta = entry.metadata
    if shard.owns(meta.namespace, entry.spec.saga):
        return True
    if labels is not None:
        labels.file("undoentries", meta.namespace, meta.name, entry.spec.saga)
    return False
