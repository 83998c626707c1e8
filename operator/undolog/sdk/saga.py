"""An agent's handle on one external saga (async)."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, ParamSpec, TypeVar

from undolog.api.common import API_VERSION, Call
from undolog.api.saga import CompensationPolicy, SagaPhase
from undolog.calls.protocol import forward_key
from undolog.controller.ledger import capped_output
from undolog.decisions.phases import ABORT_REASON_ANNOTATION, FAILED_STEP_ANNOTATION, FINALIZER, TERMINAL
from undolog.kube import ApiException, Body, Kube, is_conflict

CONFLICT_RETRIES = 10


class SagaEnded(RuntimeError):
    """The saga is no longer Active: no step may be registered or run."""


class NoSaga(RuntimeError):
    """An @undoable tool was called outside `async with saga:`."""


_current_saga: contextvars.ContextVar[SagaRun] = contextvars.ContextVar("undolog_saga")
_current_step: contextvars.ContextVar[StepRun] = contextvars.ContextVar("undolog_step")


def current_saga() -> SagaRun:
    try:
        return _current_saga.get()
    except LookupError:
        raise NoSaga("no saga is open here: call @undoable tools inside `async with saga:`") from None


def current_step() -> StepRun:
    """The step being run: its `forward_key` is the Idempotency-Key for the tool's own call."""
    try:
        return _current_step.get()
    except LookupError:
        raise NoSaga("no step is running here: current_step() works inside a saga step or @undoable tool") from None


def describe_error(error: BaseException) -> str:
    """`Type: message`, or just the type when the message is empty (httpx timeouts)."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _timestamp() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


@dataclass
class StepRun:
    """One registered tool call. Use `forward_key` as the call's Idempotency-Key; set `output`."""

    saga: SagaRun
    name: str
    position: int
    undo_id: str
    entry: Body
    output: dict[str, Any] | None = None

    @property
    def forward_key(self) -> str:
        return forward_key(self.saga.uid, self.name)

    @property
    def entry_name(self) -> str:
        return str(self.entry["metadata"]["name"])


@dataclass
class SagaRun:
    kube: Kube
    body: Body
    owns_client: bool = False
    _positions: int = 0
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _ended: str | None = None
    _failed_step: str | None = None
    _names: set[str] = field(default_factory=set)
    _token: contextvars.Token[SagaRun] | None = None

    @property
    def name(self) -> str:
        return str(self.body["metadata"]["name"])

    @property
    def namespace(self) -> str:
        return str(self.body["metadata"]["namespace"])

    @property
    def uid(self) -> str:
        return str(self.body["metadata"]["uid"])

    # -- steps -------------------------------------------------------------------------------

    async def register(self, step: str, compensation: Call | None) -> StepRun:
        """Write the step's UndoEntry (write-ahead) and mark its effect Executing.

        Positions come from a lock-guarded counter, so concurrent tool calls get distinct,
        strictly increasing positions; AlreadyExists on a position is never retried silently.
        """
        if self._ended:
            raise SagaEnded(f"saga {self.namespace}/{self.name} is {self._ended}: step {step!r} was not registered")
        self.body = await self.kube.get("sagas", self.namespace, self.name)
        phase = self.body.get("status", {}).get("phase")
        if phase not in (None, "Active") or self.body["spec"].get("outcome"):
            raise SagaEnded(f"saga {self.namespace}/{self.name} is {phase}: step {step!r} was not registered or run")
        async with self._lock:
            self._positions += 1
            position = self._positions
            if step in self._names:  # a tool called twice: each call its own step and forward key
                step = f"{step}-{position}"
            self._names.add(step)
        undo_id = str(uuid.uuid4())
        spec: Body = {
            "saga": self.name,
            "undoId": undo_id,
            "stackPosition": position,
            "effectId": forward_key(self.uid, step),
            "step": step,
            "registeredAt": _timestamp(),
        }
        if compensation is not None:
            spec["compensation"] = compensation.to_api()
        entry = await self.kube.create(
            "undoentries",
            self.namespace,
            {
                "apiVersion": API_VERSION,
                "kind": "UndoEntry",
                "metadata": {
                    "name": f"{self.name}-{position}",
                    "ownerReferences": [
                        {
                            "apiVersion": API_VERSION,
                            "kind": "Saga",
                            "name": self.name,
                            "uid": self.uid,
                            "blockOwnerDeletion": True,
                        }
                    ],
                },
                "spec": spec,
            },
        )
        entry = await self.kube.patch_status(
            "undoentries", self.namespace, entry["metadata"]["name"], {"status": {"effect": "Executing"}}
        )
        return StepRun(self, step, position, undo_id, entry)

    async def finish(self, run: StepRun, error: BaseException | None = None) -> None:
        """Record the effect's outcome: Committed with its output, or Failed with the error."""
        status: Body = {"executedAt": _timestamp()}
        if error is None:
            status["effect"] = "Committed"
            output = capped_output(run.output)
            if output is not None:
                status["output"] = output
        else:
            status["effect"] = "Failed"
            status["lastError"] = describe_error(error)[:4096]
        run.entry = await self.kube.patch_status("undoentries", self.namespace, run.entry_name, {"status": status})

    @asynccontextmanager
    async def step(self, name: str, compensation: Call | None = None) -> AsyncIterator[StepRun]:
        """Register, run the body, record the outcome. An exception marks the effect Failed
        (its outcome may be partial, so it is still compensated) and propagates."""
        run = await self.register(name, compensation)
        token = _current_step.set(run)
        try:
            yield run
        except BaseException as error:
            self.note_failure(run)
            await self.finish(run, error)
            raise
        finally:
            _current_step.reset(token)
        await self.finish(run)

    # -- ending ------------------------------------------------------------------------------

    def note_failure(self, run: StepRun) -> None:
        """The first step that raised is the one named when the saga is aborted."""
        self._failed_step = self._failed_step or run.name

    async def end_block(self, error: BaseException | None) -> None:
        """Leaving `with saga:`: commit, or abort with the error; then release the client."""
        try:
            if error is None:
                await self.commit()
            else:
                await self.abort(describe_error(error), self._failed_step)
        finally:
            await self.close()

    async def stage_effect(self, name: str, call: Call) -> None:
        """A post-commit effect: sent by the operator once the saga is Completed, never after an
        abort (the same outbox as orchestrated sagas' spec.effects)."""
        async with self._lock:
            for _ in range(CONFLICT_RETRIES):  # the operator writes the same saga: retry on conflict
                self.body = await self.kube.get("sagas", self.namespace, self.name)
                effects = [*self.body["spec"].get("effects", []), {"name": name, "call": call.to_api()}]
                patch = {
                    "metadata": {"resourceVersion": self.body["metadata"]["resourceVersion"]},
                    "spec": {"effects": effects},
                }
                try:
                    self.body = await self.kube.patch("sagas", self.namespace, self.name, patch)
                    return
                except ApiException as error:
                    if not is_conflict(error):
                        raise
            raise SagaEnded(f"saga {self.namespace}/{self.name} kept changing: effect {name!r} was not staged")

    async def commit(self) -> None:
        await self._end("Commit", {})

    async def abort(self, reason: str, failed_step: str | None = None) -> None:
        annotations = {ABORT_REASON_ANNOTATION: reason[:1024]}
        if failed_step:
            annotations[FAILED_STEP_ANNOTATION] = failed_step
        await self._end("Abort", annotations)

    async def _end(self, outcome: str, annotations: dict[str, str]) -> None:
        if self._ended:
            return
        self._ended = outcome
        patch: Body = {"spec": {"outcome": outcome}}
        if annotations:
            patch["metadata"] = {"annotations": annotations}
        self.body = await self.kube.patch("sagas", self.namespace, self.name, patch)

    async def wait(self, phases: tuple[SagaPhase, ...] = (*TERMINAL, "Halted"), within: float = 60.0) -> Body:
        """Poll until the saga reaches one of `phases`; TimeoutError after `within` seconds."""
        deadline = time.monotonic() + within
        while True:
            self.body = await self.kube.get("sagas", self.namespace, self.name)
            if self.body.get("status", {}).get("phase") in phases:
                return self.body
            if time.monotonic() > deadline:
                phase = self.body.get("status", {}).get("phase")
                raise TimeoutError(f"saga {self.namespace}/{self.name} is {phase}, not {' or '.join(phases)}")
            await asyncio.sleep(0.2)

    async def close(self) -> None:
        if self.owns_client:
            await self.kube.close()

    async def __aenter__(self) -> SagaRun:
        self._token = _current_saga.set(self)
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, _: TracebackType | None
    ) -> None:
        """Leaving the block commits; an exception aborts (and propagates)."""
        if self._token is not None:
            _current_saga.reset(self._token)
            self._token = None
        await self.end_block(error)


async def open_saga(
    name: str | None = None,
    *,
    generate_name: str | None = None,
    namespace: str = "default",
    org: str | None = None,
    deadline_seconds: int | None = None,
    policy: CompensationPolicy | None = None,
    kube: Kube | None = None,
    kubeconfig: str | None = None,
) -> SagaRun:
    """Create an Active external saga (from KUBECONFIG, or in-cluster when unset)."""
    if (name is None) == (generate_name is None):
        raise ValueError("give exactly one of name or generate_name")
    owns = kube is None
    client = kube or await Kube.connect(kubeconfig)
    spec: Body = {}
    if org:
        spec["orgId"] = org
    if deadline_seconds:
        spec["activeDeadlineSeconds"] = deadline_seconds
    if policy:
        spec["compensationPolicy"] = policy.to_api()
    # Created with the operator's finalizer: deleting it at any moment compensates it first.
    metadata: Body = {"name": name} if name else {"generateName": generate_name}
    metadata["finalizers"] = [FINALIZER]
    try:
        body = await client.create(
            "sagas", namespace, {"apiVersion": API_VERSION, "kind": "Saga", "metadata": metadata, "spec": spec}
        )
    except BaseException:
        if owns:
            await client.close()
        raise
    return SagaRun(client, body, owns_client=owns)


P = ParamSpec("P")
R = TypeVar("R")


def undoable(
    compensation: Callable[..., Call | None] | None = None, *, step: str | None = None
) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R]]]:
    """Make an async tool undoable within the current saga.

    `compensation` gets the tool's own arguments and returns the Call that undoes it; it runs
    before the tool, so the undo is on the ledger before the effect can happen. A tool that
    returns a dict has it stored as the step's output (usable in `${steps.<name>.output...}`).
    Inside the tool, `current_step().forward_key` is the Idempotency-Key for its own call.
    """

    def wrap(tool: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
        name = step or tool.__name__

        @functools.wraps(tool)
        async def run(*args: P.args, **kwargs: P.kwargs) -> R:
            saga = current_saga()
            undo = compensation(*args, **kwargs) if compensation else None
            async with saga.step(name, undo) as running:
                result = await tool(*args, **kwargs)
                if isinstance(result, dict):
                    running.output = result
                return result

        return run

    return wrap
