"""The operator layer (driver, recorder, compensator, forwarder, ledger) on its seams: an
in-memory object store and a scripted transport. No sockets, no apiserver: what is called, in
which order, with which headers, and what is written to the ledger."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.support.fakes import FakeKube, FakeTransport, FixedFence
from tests.support.objects import entry_body
from tests.support.waiting import eventually
from undolog import errors
from undolog.api import (
    Saga,
    UndoEntry,
)
from undolog.controller.context import DriverContext
from undolog.controller.driver import SagaDriver
from undolog.controller.engine import Engine, ShardParts, shard_engine
from undolog.controller.entry_proof import Listed
from undolog.controller.timeline import Timeline
from undolog.conventions import FINALIZER, now
from undolog.decisions.retry import CallOutcome
from undolog.kube import Body, Plural
from undolog.kube.watch import Progress

NS = "ns"
FAST = {"backoff": {"initialMilliseconds": 1, "maxMilliseconds": 2, "maxRetries": 3}}
OK = CallOutcome(status_code=200)


@dataclass
class QuietShard:
    """The informer as a driver run alone sees it (controller/context.py's ShardFeed): nobody
    subscribed, and an entry watch as far as the test says."""

    watched: Progress | None = None  # the entry watch's progress (None: no watch shows every entry)

    def written(self, saga: Saga) -> None:
        return None

    def finished(self, saga: Saga, entries: list[UndoEntry]) -> None:
        return None

    def seen_again(self, saga: Saga) -> None:
        return None

    def entries_seen(self, namespace: str) -> Progress | None:
        return self.watched


@dataclass
class Operator:
    kube: FakeKube
    transport: FakeTransport
    fence: FixedFence
    context: DriverContext
    timeline: Timeline
    shard: QuietShard

    def engine(self, **options: Any) -> Engine:
        """An engine over this operator's fakes, leading (its watches not started)."""
        engine = shard_engine(
            ShardParts(
                self.kube,  # type: ignore[arg-type]
                self.context.ledger,
                self.context.compensator,
                self.context.forwarder,
                self.timeline,
                self.fence,
                **options,
            )
        )
        engine.informer.state.leading = True
        return engine

    def webhook(self, name: str) -> None:
        self.kube.put(
            "webhooks",
            {
                "apiVersion": "undolog.io/v1beta1",
                "kind": "Webhook",
                "metadata": {"name": name, "namespace": NS},
                "spec": {"versions": [{"name": "v1", "url": f"http://participant.test/{name}"}], "timeoutSeconds": 2},
            },
        )

    def saga(self, name: str, phase: str | None = "Active", namespace: str = NS, **spec: Any) -> Body:
        return self.kube.put(
            "sagas",
            {
                "apiVersion": "undolog.io/v1beta1",
                "kind": "Saga",
                "metadata": {"name": name, "namespace": namespace, "finalizers": [FINALIZER], "labels": {}},
                "spec": {"compensationPolicy": FAST, **spec},
                "status": {"phase": phase, "stackDepth": 0},
            },
        )

    def entry(self, saga: Body, position: int, *, indexed: bool = True, **fields: Any) -> Body:
        body = entry_body(saga["metadata"]["name"], position, owner_uid=saga["metadata"]["uid"], **fields)
        stored = self.kube.put("undoentries", body)
        if indexed:  # seen by the watch; an entry that is not, is one the watch lags behind on
            self.context.index.keep(UndoEntry.model_validate(stored))
        return stored

    def aborted(self, name: str, depth: int) -> Body:
        """An Active saga aborted (spec.outcome: Abort) with entries at positions 1 to `depth`."""
        saga = self.saga(name, outcome="Abort")
        for position in range(1, depth + 1):
            self.entry(saga, position)
        return saga

    async def drive(self, name: str, *, listed: Body | None = None) -> Saga:
        """One reconcile of the saga's driver, to the point where it would wait; `listed`: the
        saga as the engine listed it on taking charge, just before its entries."""
        driver = SagaDriver(self.context, NS, name)
        if listed is not None:
            driver.listed = Listed(listed["metadata"]["resourceVersion"], now())
        await driver.reconcile()
        await self.timeline.stop(drain_seconds=1)
        self.timeline.start()
        return Saga.model_validate(self.kube.body("sagas", NS, name))

    async def run_until(self, name: str, phase: str, within: float) -> None:
        """The saga's driver as the engine runs it (conflicts, a Lease in doubt and all), until
        the saga reaches `phase`; then it is stopped."""
        driver = SagaDriver(self.context, NS, name)
        driver.task = asyncio.create_task(driver.run())

        async def seen() -> str:
            return str(self.kube.body("sagas", NS, name)["status"]["phase"])

        await eventually(seen, lambda now: now == phase, within, f"saga {name} {phase}")
        driver.notify(None)
        await driver.task

    def watch_showing_entry_writes(self) -> Progress:
        """An entry watch that is never behind: each entry write's echo is applied as it is made."""
        progress = self.shard.watched = Progress()
        plain = self.kube.patch

        async def echoed(plural: Plural, namespace: str, name: str, patch: Body, **at: str) -> Body:
            written = await plain(plural, namespace, name, patch, **at)
            if plural == "undoentries":
                progress.advance(written["metadata"]["resourceVersion"])
            return written

        self.kube.patch = echoed  # type: ignore[method-assign]
        return progress

    def entry_lists(self) -> int:
        return sum(1 for r in self.kube.requests if r == ("list", "undoentries"))

    def saga_write_lost_once(self, when: Callable[[Body], bool] = lambda patch: True) -> list[str]:
        """The first saga status write whose patch matches `when` loses to another writer (409);
        the returned list names the saga it happened to."""
        plain = self.kube.patch_status
        conflicts: list[str] = []

        async def lost_once(plural: Plural, namespace: str, name: str, patch: Body) -> Body:
            if plural == "sagas" and when(patch) and not conflicts:
                conflicts.append(name)
                raise errors.Conflict("the object has been modified", status=409)
            return await plain(plural, namespace, name, patch)

        self.kube.patch_status = lost_once  # type: ignore[method-assign]
        return conflicts

    def state(self, name: str) -> tuple[str, str]:
        body = self.kube.body("undoentries", NS, name)
        return body["status"].get("effect", "Pending"), body["status"].get("state", "Pending")

    def undone(self) -> list[int]:
        """Positions compensated, in the order the calls were sent."""
        return [c.body["n"] for c in self.transport.sent if c.target.url.endswith("/undo")]
