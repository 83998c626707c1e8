"""The agent SDK: open a saga, register each tool call before it runs, commit or abort.

async with await undolog.sdk.open_saga(generate_name="onboard-", namespace="agents") as saga:
    async with saga.step("create_user", compensation=Call(function="delete-user", args={...})) as step:
        step.output = await create_user(idempotency_key=step.forward_key)
# leaving the block commits; an exception aborts, and the operator undoes what ran, newest first
"""

from undolog.api import Call, Guard
from undolog.errors import NoSaga, NotSent, RewindNotDone, SagaEnded
from undolog.sdk.saga import SagaRun, StepRun, current_saga, current_step, open_saga, undoable

__all__ = [
    "Call",
    "Guard",
    "NoSaga",
    "NotSent",
    "RewindNotDone",
    "SagaEnded",
    "SagaRun",
    "StepRun",
    "current_saga",
    "current_step",
    "open_saga",
    "undoable",
]
