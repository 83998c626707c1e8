"""The saga of bench.temporal, written the way Temporal's saga samples write one: each step an
activity calling the participant, its compensation registered before it runs, and on failure
(here: an abort signal after the last step) the compensations run newest first.

The worker runs in its own process (`python -m bench.temporal_saga <address>`), as UndoLog's
operator does, so it shares no interpreter with the benchmark's client.
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass
from datetime import timedelta

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker

with workflow.unsafe.imports_passed_through():
    import httpx

TASK_QUEUE = "undolog-bench"
RETRIES = RetryPolicy(initial_interval=timedelta(milliseconds=100), maximum_attempts=5)
_client: httpx.AsyncClient | None = None


@dataclass
class Call:
    url: str
    saga: str
    n: int
    key: str


@dataclass
class SagaInput:
    participant: str  # base URL
    saga: str
    wait_for_outcome: bool  # True: after the steps, wait for commit or abort (the abort benchmark)


async def _post(call: Call) -> None:
    global _client
    if _client is None:
        _client = httpx.AsyncClient(timeout=10)
    answer = await _client.post(
        call.url,
        json={"saga": call.saga, "n": call.n},
        headers={"Idempotency-Key": call.key, "Undolog-Saga": call.saga},
    )
    if answer.status_code >= 300:
        raise ApplicationError(f"HTTP {answer.status_code}", non_retryable=400 <= answer.status_code < 500)


@activity.defn
async def step(call: Call) -> None:
    await _post(call)


@activity.defn
async def undo(call: Call) -> None:
    await _post(call)


@workflow.defn
class ThreeStepSaga:
    def __init__(self) -> None:
        self.outcome: str | None = None

    @workflow.signal
    def abort(self) -> None:
        self.outcome = "abort"

    @workflow.signal
    def commit(self) -> None:
        self.outcome = "commit"

    @workflow.run
    async def run(self, saga: SagaInput) -> str:
        compensations: list[Call] = []
        try:
            for n in (1, 2, 3):
                compensations.append(Call(f"{saga.participant}/undo", saga.saga, n, f"{saga.saga}:{n}:undo"))
                await workflow.execute_activity(
                    step,
                    Call(f"{saga.participant}/step", saga.saga, n, f"{saga.saga}:{n}:fwd"),
                    start_to_close_timeout=timedelta(seconds=10),
                    retry_policy=RETRIES,
                )
            if saga.wait_for_outcome:
                await workflow.wait_condition(lambda: self.outcome is not None)
                if self.outcome == "abort":
                    raise ApplicationError("aborted")
            return "Completed"
        except Exception:
            for call in reversed(compensations):
                await workflow.execute_activity(
                    undo, call, start_to_close_timeout=timedelta(seconds=10), retry_policy=RETRIES
                )
            return "Compensated"


async def serve(address: str) -> None:
    client = await Client.connect(address)
    worker = Worker(
        client,
        task_queue=TASK_QUEUE,
        workflows=[ThreeStepSaga],
        activities=[step, undo],
        max_concurrent_activities=200,
        max_concurrent_workflow_tasks=200,
    )
    print("worker ready", flush=True)
    await worker.run()


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1]))
