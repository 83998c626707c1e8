"""Leader election with a coordination.k8s.io Lease: one operator drives sagas, the others
watch and wait. kopf's peering is hot standby by priority and freezes peers of equal priority,
so a Lease (as controller-runtime uses) decides instead.

The leader renews the Lease every retry period; a standby takes over once the Lease has not
been renewed for its duration. A leader that cannot renew within the renew deadline stops
driving sagas before a standby can take over, so two never act at once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from kubernetes_asyncio.leaderelection import electionconfig, leaderelection
from kubernetes_asyncio.leaderelection.resourcelock.leaselock import LeaseLock

from undolog.kube import Kube

log = logging.getLogger("undolog.leadership")


@dataclass(frozen=True)
class LeaseSettings:
    namespace: str
    name: str = "undolog-operator"
    lease_seconds: int = 15  # controller-runtime's defaults: 15 s lease, 10 s renew, 2 s retry

    def __post_init__(self) -> None:
        if self.lease_seconds < 3:
            raise ValueError(f"lease_seconds={self.lease_seconds}: a Lease shorter than 3 s cannot be renewed safely")

    @property
    def retry_period(self) -> float:
        return max(1.0, self.lease_seconds / 7.5)

    @property
    def renew_deadline(self) -> float:
        return max(self.lease_seconds * 2 / 3, self.retry_period * 1.5)


def identity() -> str:
    return f"{os.environ.get('HOSTNAME') or socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


async def campaign(
    kube: Kube, settings: LeaseSettings, lead: Callable[[], Awaitable[None]], follow: Callable[[], Awaitable[None]]
) -> None:
    """Run for leadership forever: `lead` when the Lease is ours, `follow` when it is lost."""
    me = identity()

    async def started() -> None:
        log.info("%s leads (Lease %s/%s)", me, settings.namespace, settings.name)
        await lead()

    async def stopped() -> None:
        log.warning("%s lost the Lease %s/%s; it stops driving sagas", me, settings.namespace, settings.name)
        await follow()

    while True:  # run() returns only after leading and losing the Lease: stand for it again
        config = electionconfig.Config(
            LeaseLock(settings.name, settings.namespace, me, kube.api),
            lease_duration=settings.lease_seconds,
            renew_deadline=settings.renew_deadline,
            retry_period=settings.retry_period,
            onstarted_leading=started,
            onstopped_leading=stopped,
        )
        try:
            await leaderelection.LeaderElection(config).run()
        except Exception as error:  # the API went away mid-election: not leading, try again
            log.error("leader election failed: %s; standing again in %.0f s", error, settings.retry_period)
            await follow()
            await asyncio.sleep(settings.retry_period)
