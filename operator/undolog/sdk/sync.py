"""The same SDK for synchronous agents: each saga runs its async half on a private event-loop
thread, so tool calls from several threads get distinct positions just as tasks do.

    with undolog.sdk.sync.open_saga(generate_name="onboard-", namespace="agents") as saga:
        with saga.step("create_user", compensation=Call(function="delete-user", args={...})) as step:
            step.output = create_user(idempotency_key=step.forward_key)
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from collections.abc import Callable, Coroutine, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from types import TracebackType
from typing import Any, Concatenate, ParamSpec, TypeVar

from undolog.api import Call, CompensationPolicy
from undolog.errors import NoSaga
from undolog.sdk import saga as async_saga
from undolog.sdk.saga import StepRun

T = TypeVar("T")
P = ParamSpec("P")
R = TypeVar("R")

_current: contextvars.ContextVar[Saga] = contextvars.ContextVar("undolog_sync_saga")


class _Loop:
    """An event loop on a daemon thread; `run` blocks the caller until the coroutine is done."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="undolog-sdk", daemon=True)
        self.thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        return future.result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
        self.loop.close()


def _blocking(
    method: Callable[Concatenate[async_saga.SagaRun, P], Coroutine[Any, Any, R]],
) -> Callable[Concatenate[Saga, P], R]:
    """The async SagaRun's method as the sync Saga's: the same parameters, by construction."""

    def blocking(self: Saga, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return self._loop.run(method(self._run, *args, **kwargs))

    functools.update_wrapper(blocking, method)  # its name, docstring and signature
    return blocking


class Saga:
    """Synchronous handle on an external saga; the async SagaRun's methods, blocking."""

    def __init__(self, loop: _Loop, run: async_saga.SagaRun) -> None:
        self._loop, self._run = loop, run
        self._token: contextvars.Token[Saga] | None = None

    @property
    def name(self) -> str:
        return self._run.name

    @property
    def namespace(self) -> str:
        return self._run.namespace

    @property
    def uid(self) -> str:
        return self._run.uid

    @contextmanager
    def step(
        self, name: str, compensation: Call | None = None, *, depends_on: Sequence[str] | None = None
    ) -> Iterator[StepRun]:
        run = self._loop.run(self._run.register(name, compensation, depends_on))
        try:
            yield run
        except BaseException as error:
            self._run.note_failure(run)
            self._loop.run(self._run.finish(run, error))
            raise
        self._loop.run(self._run.finish(run))

    stage_effect = _blocking(async_saga.SagaRun.stage_effect)
    commit = _blocking(async_saga.SagaRun.commit)
    abort = _blocking(async_saga.SagaRun.abort)
    rewind_to = _blocking(async_saga.SagaRun.rewind_to)
    wait = _blocking(async_saga.SagaRun.wait)

    def close(self) -> None:
        try:
            self._loop.run(self._run.close())
        finally:
            self._loop.stop()

    def __enter__(self) -> Saga:
        self._token = _current.set(self)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self._token is not None:
            _current.reset(self._token)
            self._token = None
        try:
            self._loop.run(self._run.end_block(error))
        finally:
            self._loop.stop()


def open_saga(
    name: str | None = None,
    *,
    generate_name: str | None = None,
    namespace: str | None = None,
    org: str | None = None,
    principal: str | None = None,
    deadline_seconds: int | None = None,
    policy: CompensationPolicy | None = None,
    ttl_seconds_after_finished: int | None = None,
    kubeconfig: str | None = None,
    resume: bool = False,
) -> Saga:
    """The async open_saga, blocking: the same parameters but `kube` (a connection belongs to
    the event loop that made it; this saga's loop is its own). A test holds them equal."""
    options = dict(locals())
    loop = _Loop()
    try:
        run = loop.run(async_saga.open_saga(**options))
    except BaseException:
        loop.stop()
        raise
    return Saga(loop, run)


def undoable(
    compensation: Callable[..., Call | None] | None = None,
    *,
    step: str | None = None,
    depends_on: Sequence[str] | None = None,
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """`undolog.sdk.undoable` for synchronous tools, within `with saga:`."""

    def wrap(tool: Callable[P, R]) -> Callable[P, R]:
        name = step or tool.__name__

        @functools.wraps(tool)
        def run(*args: P.args, **kwargs: P.kwargs) -> R:
            try:
                saga = _current.get()
            except LookupError:
                raise NoSaga("no saga is open here: call @undoable tools inside `with saga:`") from None
            undo = compensation(*args, **kwargs) if compensation else None
            with saga.step(name, undo, depends_on=depends_on) as running:
                result = tool(*args, **kwargs)
                if isinstance(result, dict):
                    running.output = result
                return result

        return run

    return wrap
