"""`undolog verify`: run an orchestrated saga once per way it can fail, for real, against the
participants its Webhooks name, and check that each run undid everything in order
(decisions/verification.py says which runs and what they must show).

The runs happen in a scratch namespace (created and deleted here unless one is given) with a
copy of the Webhooks, so nothing of the user's own sagas is touched. The operator that watches
that namespace does the work, exactly as in production.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from undolog import errors
from undolog.api import Saga, SagaPhase, SagaSpec, UndoEntry, Webhook
from undolog.conventions import RETRY_ANNOTATION
from undolog.decisions import verification
from undolog.decisions.phases import FINAL
from undolog.decisions.verification import FailurePoint
from undolog.errors import CommandError
from undolog.inspect import Inspector
from undolog.kube import Kube

SCRATCH_LABEL = "undolog.io/verify"
POLL_SECONDS = 0.2


@dataclass
class Run:
    point: FailurePoint
    saga: str
    phase: SagaPhase | None = None
    undone: list[str] = field(default_factory=list)
    gaps: list[str] = field(default_factory=list)
    seconds: float = 0.0


@dataclass
class Verifier:
    kube: Kube
    namespace: str
    within: float = 120.0

    @property
    def inspector(self) -> Inspector:
        return Inspector(self.kube)

    async def verify(self, manifest: dict[str, Any], webhooks: Sequence[dict[str, Any]]) -> list[Run]:
        spec = SagaSpec.model_validate(manifest.get("spec", {}))
        if not spec.steps:
            raise CommandError("undolog verify needs an orchestrated saga: spec.steps is empty")
        points = verification.failure_points(spec.steps)
        if not points:
            raise CommandError("the saga has no Compensatable step: nothing would ever be compensated")
        registered = [Webhook.model_validate(w) for w in webhooks]
        for webhook in registered:
            body = webhook.model_dump(by_alias=True, exclude_none=True, include={"api_version", "kind", "spec"})
            await self.kube.create("webhooks", self.namespace, {**body, "metadata": {"name": webhook.metadata.name}})
        by_name = {w.metadata.name: w for w in registered}
        base = str(manifest.get("metadata", {}).get("name") or "saga")[:150]
        runs = [Run(point, f"{base}-verify-{point.suffix}") for point in points]
        await asyncio.gather(*(self.run(r, manifest, by_name) for r in runs))
        return runs

    async def run(self, run: Run, manifest: dict[str, Any], webhooks: dict[str, Webhook]) -> None:
        started = time.monotonic()
        variant = verification.variant_manifest(manifest, run.point, run.saga)
        await self.kube.create("sagas", self.namespace, variant)
        saga = await self.until_final(run.saga)
        broken = run.point.halts_on
        if broken is not None and broken.compensation is not None and saga.status.phase == SagaPhase.HALTED:
            # Fix it as a person would: register the function, then retry.
            real = webhooks.get(broken.compensation.function)
            if real is None:
                run.gaps.append(f"no Webhook {broken.compensation.function!r} was given to copy for the retry")
            else:
                copy = real.model_dump(by_alias=True, exclude_none=True, include={"api_version", "kind", "spec"})
                stand_in = verification.broken_function(broken.name)
                await self.kube.create("webhooks", self.namespace, {**copy, "metadata": {"name": stand_in}})
                await self.inspector.retry(self.namespace, run.saga, "undolog verify: the compensation was fixed")
                saga = await self.until_final(run.saga, after=saga)
        elif broken is not None:
            run.gaps.append(f"did not halt on the compensation of {broken.name} (phase {saga.status.phase})")
        entries: list[UndoEntry] = await self.inspector.entries(saga)
        run.phase = saga.status.phase
        run.undone = verification.undone_in_order(entries)
        run.gaps += verification.gaps(run.point, saga, entries)
        run.seconds = time.monotonic() - started

    async def until_final(self, name: str, after: Saga | None = None) -> Saga:
        """The saga once it is final (and, after a retry, past the phase it was in)."""
        deadline = time.monotonic() + self.within
        while True:
            saga = await self.inspector.saga(self.namespace, name)
            moved = after is None or saga.metadata.resource_version != after.metadata.resource_version
            if saga.status.phase in FINAL and moved and not saga.metadata.annotations.get(RETRY_ANNOTATION):
                return saga
            if time.monotonic() > deadline:
                return saga
            await asyncio.sleep(POLL_SECONDS)


async def scratch_namespace(kube: Kube) -> str:
    name = f"undolog-verify-{secrets.token_hex(3)}"
    try:
        await kube.create_namespace(name, {SCRATCH_LABEL: "true"})
    except errors.KubeError as error:
        raise CommandError(
            f"cannot create the scratch namespace {name}: {error.message} (or give one with -n)"
        ) from None
    return name
