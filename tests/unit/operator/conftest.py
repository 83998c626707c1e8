"""The operator under test, on fakes (harness.Operator)."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator

import pytest

from tests.support.fakes import FakeKube, FakeTransport, FixedFence
from tests.unit.operator.harness import Operator, QuietShard
from undolog.calls.registry import Registry
from undolog.calls.runner import Runner
from undolog.controller.compensation import Compensator
from undolog.controller.context import DriverContext, SagaSlots, without_slot
from undolog.controller.entry_index import EntryIndex
from undolog.controller.forward import Forwarder
from undolog.controller.object_undo import ObjectUndoer
from undolog.controller.recorded_call import CallRecorder
from undolog.controller.timeline import Timeline
from undolog.kube import Kube
from undolog.kube.kubeconfig import Credentials
from undolog.kube.objects import ObjectReads
from undolog.ledger import Ledger


def unreachable_api() -> Kube:
    """No object is undone natively on the fakes (the cluster tests undo real ones)."""
    return Kube(Credentials(server="https://127.0.0.1:9"))


@pytest.fixture
async def operator() -> AsyncIterator[Operator]:
    kube, transport, fence = FakeKube(), FakeTransport(), FixedFence()
    ledger = Ledger(kube)
    timeline = Timeline(kube)
    timeline.start()
    runner = Runner(transport, fence, rng=random.Random(1), away=without_slot)
    recorder = CallRecorder(ledger, Registry(ledger), runner, timeline)
    reads = ObjectReads(unreachable_api())
    shard = QuietShard()
    context = DriverContext(
        ledger=ledger,
        timeline=timeline,
        index=EntryIndex(),
        compensator=Compensator(recorder, ObjectUndoer(ledger, timeline, fence, reads.impersonation)),
        forwarder=Forwarder(recorder, reads),
        slots=SagaSlots(10),
        informer=shard,
        fence=fence,
    )
    harness = Operator(kube, transport, fence, context, timeline, shard)
    harness.webhook("undo")
    yield harness
    await timeline.stop(drain_seconds=1)
