"""Leader election with a coordination.k8s.io Lease, always on, and the fencing token it gives.

One operator holds the Lease and drives sagas; any other started with the same Lease (by
mistake, or as a standby) waits. kopf's peering freezes peers of equal priority, so a Lease
(as client-go's leader election) decides instead, written here so that it can give a fencing
token:

- the holder renews every retry period; a standby takes the Lease once it has seen no renewal
  for the Lease's duration (measured on its own clock, so clocks need not agree);
- the holder stops sending anything as soon as its last renewal is older than the renew
  deadline (shorter than the Lease): a holder frozen by SIGSTOP or a long pause finds on waking
  that it may not send, before any standby could have taken over;
- every call carries `Undolog-Fence`, the revision of the write that made its sender the
  holder, higher for each new holder, so a participant can refuse a call from a holder that
  was replaced. Not the transition count: a Lease deleted by hand (a known cure for a stuck
  election) starts that again at 0, and the next holder's fence was lower than the one it
  replaced. Revisions only grow, whatever is deleted (resourceVersions of one resource are
  comparable, KEP-5504).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol

from undolog import errors
from undolog.api.common import revision_in
from undolog.conventions import timestamp
from undolog.decisions.sharding import Shard
from undolog.kube import Body

log = logging.getLogger("undolog.leadership")


class LeaseStore(Protocol):
    """What the election needs of the API (undolog.kube.Kube; a fake in unit tests)."""

    async def get_lease(self, namespace: str, name: str) -> Body: ...
    async def create_lease(self, namespace: str, body: Body) -> Body: ...
    async def replace_lease(self, namespace: str, name: str, body: Body) -> Body: ...


@dataclass(frozen=True)
class LeaseSettings:
    namespace: str
    name: str = "undolog-operator"
    lease_seconds: int = 15  # controller-runtime's defaults: 15 s lease, 10 s renew, 2 s retry
    shard: Shard = field(default_factory=lambda: Shard(0, 1))  # the sagas the Lease is for

    def __post_init__(self) -> None:
        if self.lease_seconds < 3:
            raise ValueError(f"lease_seconds={self.lease_seconds}: a Lease shorter than 3 s cannot be renewed safely")

    def of_shard(self, shard: Shard) -> LeaseSettings:
        """One shard's Lease: the Lease itself when there is one shard, `<name>-shard-<i>` else."""
        name = self.name if shard.count == 1 else f"{self.name}-shard-{shard.index}"
        return LeaseSettings(self.namespace, name, self.lease_seconds, shard)

    @property
    def retry_period(self) -> float:
        return max(1.0, self.lease_seconds / 7.5)

    @property
    def renew_deadline(self) -> float:
        return max(self.lease_seconds * 2 / 3, self.retry_period * 1.5)


def identity() -> str:
    """Unique among live operators. In a pod, the pod's name (POD_NAME): a container restarted
    in the same pod is the same holder, and takes its Lease back at once (its predecessor is
    dead: the kubelet starts a container only after the last one exited). Elsewhere the host,
    the process and a random part: a second process must wait out the first one's Lease."""
    pod = os.environ.get("POD_NAME")
    if pod:
        return pod
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class Leadership:
    """Runs for the Lease forever; is the fence every call and every write is checked against."""

    def __init__(
        self,
        kube: LeaseStore,
        settings: LeaseSettings,
        me: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube, self.settings = kube, settings
        self.me = me or identity()
        self.clock = clock
        self.leading = False
        self._renewed_at = float("-inf")  # monotonic time of the last successful acquire or renew
        self._fence: int | None = None
        self._observed: tuple[str, str, str] | None = None  # the other holder's last record seen...
        self._observed_at = 0.0  # ...and when it was first seen, on this clock
        self._written: Body | None = None  # the Lease as this holder last wrote it

    # -- the fence -------------------------------------------------------------------------------

    def check(self) -> None:
        if not self.leading or self.clock() - self._renewed_at > self.settings.renew_deadline:
            raise errors.NotLeading(f"{self.me} does not hold the Lease {self.reference} (or cannot be sure)")

    def token(self) -> int | None:
        return self._fence

    def shard(self) -> str | None:
        return str(self.settings.shard)

    @property
    def reference(self) -> str:
        return f"{self.settings.namespace}/{self.settings.name}"

    # -- the election ----------------------------------------------------------------------------

    async def run(
        self,
        lead: Callable[[], Coroutine[Any, Any, None]],
        follow: Callable[[], Awaitable[None]],
        *,
        may_take: Callable[[], bool] = lambda: True,
        hand_back: Callable[[], bool] = lambda: False,
    ) -> None:
        """Stand for the Lease forever: `lead` when it is ours, `follow` when another has it.

        With shards, `may_take` says whether this replica stands for the Lease when it is free
        (it holds less than its fair share), and `hand_back` whether to give it up now (it holds
        more): drivers stopped first, then the Lease released, so the next holder takes over at
        once. The Lease is read every period either way, so a free one is taken on time.

        `lead` runs beside the renewals, never before them: taking charge of ten thousand sagas
        (listing their entries, starting their drivers) takes longer than a Lease. A renewal
        that comes too late only fences this holder (`check` refuses until the next one); it
        stops driving only when the Lease is seen with another holder, or comes back with
        another fence (someone held it meanwhile, so what this one knows is stale). Stopping and
        starting again on every late renewal made a busy operator thrash: at 10,000 sagas it
        lost the Lease 18 times in 9 minutes. A `lead` that fails is started again after
        `follow` has cleaned up."""
        leading: asyncio.Task[None] | None = None
        led_with: int | None = None  # the fence this holder took charge with
        try:
            while True:
                # A renewal counts from when it was asked for: one whose answer is read late (after
                # a pause) must not stretch this holder's time past what the standbys measure.
                asked_at = self.clock()
                if self.leading and hand_back():
                    log.info("%s hands the Lease %s back (a fair share for each replica)", self.me, self.reference)
                    self.leading = False
                    await _cancelled(leading)
                    await follow()
                    await self._give_back()
                    await asyncio.sleep(self.settings.retry_period)
                    continue
                try:
                    held = await self._acquire_or_renew(take=self.leading or may_take())
                except errors.KubeError as error:
                    log.warning("the Lease %s could not be read or written: %s", self.reference, error.message)
                    held = False
                late = self.clock() - self._renewed_at > self.settings.renew_deadline
                if held:
                    self._renewed_at = asked_at
                if self.leading and ((held and self._fence != led_with) or (not held and self._another_holds())):
                    self.leading = False
                    log.warning("%s lost the Lease %s; it stops driving sagas", self.me, self.reference)
                    await _cancelled(leading)
                    await follow()
                if held and not self.leading:
                    self.leading, led_with = True, self._fence
                    log.info("%s leads (Lease %s, fence %s)", self.me, self.reference, self._fence)
                    leading = asyncio.create_task(lead(), name="taking charge")
                elif held and late:
                    log.info("%s renewed the Lease %s late; it sends again", self.me, self.reference)
                elif self.leading and leading is not None and failed(leading):
                    log.error("%s could not take charge (%s); starting again", self.me, leading.exception())
                    await follow()
                    leading = asyncio.create_task(lead(), name="taking charge")
                await asyncio.sleep(self.settings.retry_period)
        finally:
            await _cancelled(leading)

    def _another_holds(self) -> bool:
        holder = self._observed[0] if self._observed else ""
        return holder not in ("", self.me)

    async def release(self) -> None:
        """On a clean shutdown: hand the Lease back, so a standby takes over at once. Whether or
        not the loop knew it led: a write cancelled by the stop may still have taken the Lease."""
        self.leading = False
        await self._give_back()

    async def _give_back(self, attempts: int = 3) -> None:
        # A renewal cancelled by the stop can land after the read below: read again on a conflict.
        for attempt in range(attempts):
            try:
                lease = await self.kube.get_lease(self.settings.namespace, self.settings.name)
                if lease["spec"].get("holderIdentity") != self.me:
                    return
                lease["spec"]["holderIdentity"] = ""
                await self.kube.replace_lease(self.settings.namespace, self.settings.name, lease)
                return
            except errors.NotFound:
                return
            except errors.Conflict as error:
                if attempt + 1 == attempts:
                    log.warning("the Lease %s was not released: %s", self.reference, error.message)
            except errors.KubeError as error:
                log.warning("the Lease %s was not released: %s", self.reference, error.message)
                return

    async def _acquire_or_renew(self, take: bool = True) -> bool:
        if self.leading and self._written is not None:
            # client-go's fast path: the holder renews the record it wrote last without reading it
            # (one request, not two, every period); a Conflict means someone wrote it since.
            with contextlib.suppress(errors.Conflict, errors.NotFound):
                return await self._write(self._written, taking=False)
        self._written = None
        settings = self.settings
        try:
            lease = await self.kube.get_lease(settings.namespace, settings.name)
        except errors.NotFound:
            return take and await self._create()
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        self._saw(lease)
        duration = spec.get("leaseDurationSeconds") or settings.lease_seconds
        if holder and holder != self.me and self.clock() - self._observed_at < duration:
            return False  # another holder renewed within its Lease duration, as far as this clock saw
        if holder != self.me and not take:
            return False
        try:
            # a new holder, or this identity's new process
            return await self._write(lease, taking=holder != self.me or self._fence is None)
        except errors.Conflict:
            return False

    def _saw(self, lease: Body) -> None:
        spec, version = lease.get("spec") or {}, str(lease["metadata"].get("resourceVersion"))
        record = (spec.get("holderIdentity") or "", str(spec.get("renewTime")), version)
        if record != self._observed:
            self._observed, self._observed_at = record, self.clock()

    async def _write(self, lease: Body, taking: bool) -> bool:
        """Write the Lease as held by this process, conditional on the resourceVersion read."""
        spec = dict(lease.get("spec") or {})
        transitions = int(spec.get("leaseTransitions") or 0)
        now = timestamp()
        if taking:
            transitions += 1  # kept for people (kubectl, client-go's convention), not as the fence
            spec["acquireTime"] = now
        spec.update(
            holderIdentity=self.me,
            leaseDurationSeconds=self.settings.lease_seconds,
            renewTime=now,
            leaseTransitions=transitions,
        )
        written = await self.kube.replace_lease(self.settings.namespace, self.settings.name, {**lease, "spec": spec})
        return self._hold(written, taking)

    async def _create(self) -> bool:
        now = timestamp()
        body: Body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.settings.name, "namespace": self.settings.namespace},
            "spec": {
                "holderIdentity": self.me,
                "leaseDurationSeconds": self.settings.lease_seconds,
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": 0,
            },
        }
        try:
            written = await self.kube.create_lease(self.settings.namespace, body)
        except errors.AlreadyExists:
            return False
        return self._hold(written, taking=True)

    def _hold(self, written: Body, taking: bool) -> bool:
        """The Lease as this process wrote it: the next renewal's base, its record seen, and a
        new fence when it was taken."""
        if taking:
            self._fence = _fence_of(written)
        self._written = written
        self._saw(written)
        return True


def _fence_of(lease: Body) -> int:
    revision = revision_in(lease)
    if revision is None:  # no storage Kubernetes ships gives one that is not a revision
        raise errors.KubeError(f"the Lease came back with resourceVersion {lease['metadata'].get('resourceVersion')!r}")
    return revision


def failed(task: asyncio.Task[None]) -> bool:
    return task.done() and not task.cancelled() and task.exception() is not None


async def _cancelled(task: asyncio.Task[None] | None) -> None:
    if task is None or task.done():
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
