"""Objects an earlier release stored as an earlier version (undolog.io/v1alpha1) written again in
the storage version, so that a later release can stop serving the earlier one (the CRDs'
status.storedVersions then lists the storage version alone). A write that changes nothing is
enough: the API encodes what it stores in the storage version. Done once per shard, by its
leader once it took charge, remembered on the shard's Lease, paced like retention
(--retention-rate). A Lease this replica created has nothing to migrate: a new installation
stores everything as v1beta1 from the start."""

from __future__ import annotations

import asyncio
import itertools
import logging

from undolog import errors, metrics
from undolog.api import VERSION
from undolog.calls.pace import Rate
from undolog.calls.runner import Fence
from undolog.controller.leadership import LeaseSettings, LeaseStore
from undolog.conventions import STORED_AS_ANNOTATION
from undolog.kube import Body, Plural
from undolog.ledger import Ledger, ObjectStore

log = logging.getLogger("undolog.storage")
Stored = tuple[Plural, str, str]  # plural, namespace, name


class StorageMigration:
    def __init__(
        self,
        objects: ObjectStore,
        ledger: Ledger,
        leases: LeaseStore,
        lease: LeaseSettings,
        fence: Fence,
        pace: Rate,
        me: str,
        namespaces: list[str],
    ) -> None:
        """`me`: this replica's identity on the Lease; `namespaces` watched (empty: all), in the
        Lease's shard."""
        self.me, self.namespaces = me, namespaces
        self.objects, self.ledger, self.leases, self.lease = objects, ledger, leases, lease
        self.fence, self.pace = fence, pace
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self.run(), name="storage migration")

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
            self.task = None

    async def run(self) -> None:
        try:
            lease = await self.leases.get_lease(self.lease.namespace, self.lease.name)
            if (lease["metadata"].get("annotations") or {}).get(STORED_AS_ANNOTATION) == VERSION:
                return
            if _created_by(lease, self.me):  # a new installation: no earlier release stored anything here
                await self._remember()
                return
            objects = await self._listed()
            for plural, namespace, name in objects:
                await self.pace.turn()
                self.fence.check()
                try:
                    await self.ledger.store_again(plural, namespace, name)
                except errors.NotFound:
                    continue
                metrics.stored_again.labels(plural).inc()
            await self._remember()
            log.info("%d objects of the shard are stored as %s (Lease %s)", len(objects), VERSION, self.lease.name)
        except errors.NotLeading:
            log.info("the storage migration stops: another replica leads the shard now (and does it)")
        except errors.KubeError as error:
            log.warning("the storage migration stops, to run again at the next start: %s", error.message)

    async def _listed(self) -> list[Stored]:
        """The shard's sagas and entries (its label selector), and the webhooks for shard 0."""
        namespaces, shard = self.namespaces, self.lease.shard
        plurals: list[Plural] = ["sagas", "undoentries", "webhooks"] if shard.index == 0 else ["sagas", "undoentries"]
        targets: list[str | None] = [*namespaces] or [None]
        listed: list[Stored] = []
        for plural, namespace in itertools.product(plurals, targets):
            selector = shard.selector() if plural != "webhooks" else None
            items = await self.objects.list(plural, namespace, label_selector=selector)
            listed += [(plural, o["metadata"]["namespace"], o["metadata"]["name"]) for o in items]
        return listed

    async def _remember(self) -> None:
        """The shard's Lease says it is done (a renewal replaces the Lease with its annotations)."""
        for _ in range(5):
            lease = await self.leases.get_lease(self.lease.namespace, self.lease.name)
            lease["metadata"].setdefault("annotations", {})[STORED_AS_ANNOTATION] = VERSION
            try:
                await self.leases.replace_lease(self.lease.namespace, self.lease.name, lease)
                return
            except errors.Conflict:  # renewed meanwhile
                continue


def _created_by(lease: Body, me: str) -> bool:
    """The Lease was created by this replica and never changed hands: no operator of an earlier
    release led this shard (one that did created it; taking it over counts a transition)."""
    spec = lease.get("spec") or {}
    return spec.get("holderIdentity") == me and not spec.get("leaseTransitions")
