"""An agent's handle on one external saga (async)."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, ParamSpec, TypeVar

from pydantic import BaseModel

from undolog import errors, tracing
from undolog.api import (
    Call,
    CompensationPolicy,
    Effect,
    EffectState,
    EntryTask,
    Guard,
    GuardStatus,
    ObjectMeta,
    ObjectUndo,
    Outcome,
    Rewind,
    RewindState,
    RewindStatus,
    Saga,
    SagaPhase,
    SagaSpec,
    UndoEntry,
)
from undolog.api.changes import EntryStatusChange, changed
from undolog.api.common import unknown_fields
from undolog.conventions import (
    ABORT_REASON_ANNOTATION,
    FAILED_STEP_ANNOTATION,
    IN_FLIGHT_MARK_AFTER,
    forward_key,
    kept_output,
    new_undo_entry,
    now,
    owned_by,
    repeated_step,
    step_name_of,
    step_name_refusal,
)
from undolog.decisions import guards, rewind
from undolog.decisions.phases import FINAL
from undolog.decisions.retry import operator_retry_seconds
from undolog.errors import NoSaga, NotSent, RewindNotDone, SagaEnded, TaskAbandoned
from undolog.kube import Kube, default_namespace
from undolog.ledger import Ledger, WaitTimedOut, through_outage, until

POLL_SECONDS = 0.2
# How long a write that records what already happened (a step's outcome, the saga's end) is
# tried again while the API cannot be reached: an apiserver restart or a control-plane upgrade
# takes seconds to a minute, and an abort that was not written left the saga Active with its
# steps' effects in place (nothing undoes an Active saga before its deadline, if it has one).
RECORD_WITHIN_SECONDS = 120.0
# A saga read to resume it is not read again by the step registered right after (a stateless MCP
# request does both: the second read was one more apiserver round trip on every tool call).
RESUMED_FRESH_SECONDS = 1.0

T = TypeVar("T")


async def recorded(write: Callable[[], Awaitable[T]], what: str, within: float = RECORD_WITHIN_SECONDS) -> T:
    """`write()`, tried again while the API is unavailable, for `within` seconds; then the last
    Unavailable, saying what was not recorded."""
    try:
        return await through_outage(write, time.monotonic() + within, operator_retry_seconds)
    except errors.Unavailable as error:
        raise errors.Unavailable(
            f"{what} could not be recorded for {within:g} s: {error.message}", status=error.status
        ) from error


_current_saga: contextvars.ContextVar[SagaRun] = contextvars.ContextVar("undolog_saga")
_current_step: contextvars.ContextVar[StepRun] = contextvars.ContextVar("undolog_step")


def typos(given: BaseModel | None, what: str) -> None:
    """ValueError naming each field `given` has none for (a typo lost silently otherwise)."""
    unknown = unknown_fields(given) if given is not None else []
    if unknown:
        raise ValueError(f"{what}: {'; '.join(unknown)}; nothing was registered")


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


@dataclass
class StepRun:
    """One registered tool call. Use `forward_key` as the call's Idempotency-Key; set `output`."""

    saga: SagaRun
    name: str
    position: int
    entry: UndoEntry
    output: dict[str, Any] | None = None
    left: GuardStatus | None = None  # what the step left, as its guard keeps it (set by `leaves`)
    _marking: asyncio.Task[None] | None = field(default=None, repr=False)
    _writing_mark: bool = field(default=False, repr=False)

    def mark_when_slow(self, ledger: Ledger) -> None:
        """Effect Executing once the step has run IN_FLIGHT_MARK_AFTER, for people watching, as
        the operator marks its own calls: a Pending entry is compensated just the same, so a
        quick step costs two writes (created, recorded), not three."""
        self._marking = asyncio.create_task(self._mark(ledger), name=f"marking {self.name} in flight")

    async def _mark(self, ledger: Ledger) -> None:
        await asyncio.sleep(IN_FLIGHT_MARK_AFTER)
        self._writing_mark = True
        try:
            status = changed(self.entry.status, {"effect": EffectState.EXECUTING})
            self.entry = await ledger.write_entry_status(self.entry, status)
        except Exception:  # only a mark (its client may be closed by now): the outcome is what counts
            with contextlib.suppress(Exception):
                self.entry = await ledger.entry(*self.entry.key)  # the mark may have landed all the same

    async def started_if_active(
        self, created: UndoEntry | BaseException, read: Saga | BaseException, ledger: Ledger
    ) -> None:
        """The step whose entry was created while its saga was read: started when the saga was
        Active, else recorded NotSent (its call never leaves) and SagaEnded raised."""
        saga = self.saga
        refused = read if isinstance(read, BaseException) else ended_refusal(read, saga.uid)
        if isinstance(read, Saga) and refused is None:
            saga.saga = read
        elif isinstance(read, Saga) and isinstance(refused, str) and read.status.phase != SagaPhase.REWINDING:
            saga._found_ended = refused  # ended for good (a rewind ends Active): later steps write nothing
        if isinstance(created, BaseException):
            if isinstance(refused, str):
                raise SagaEnded(f"{refused}: step {self.name!r} was not registered or run") from None
            raise created
        self.entry = created
        if refused is None:
            self.mark_when_slow(ledger)
            return
        if isinstance(refused, errors.NotFound):  # its entry goes with it (owned by a saga that is gone)
            raise refused
        why = refused if isinstance(refused, str) else f"saga {saga.namespace}/{saga.name} could not be read"
        await saga.finish(self, NotSent(f"{why}: the step's call was not sent"))
        if isinstance(refused, BaseException):
            raise refused
        raise SagaEnded(f"{why}: step {self.name!r} was recorded NotSent and not run")

    async def marked(self) -> None:
        """The mark settled before the outcome is written: not begun (cancelled in its wait) or
        written (its copy of the entry is the one the next write is conditional on)."""
        if self._marking is None:
            return
        if self._writing_mark:
            await self._marking
        else:
            self._marking.cancel()
        self._marking = None

    async def running_as_task(self, task: EntryTask) -> None:
        """The server answered with a task: the step's outcome is unknown until it ends, and an
        abort of the saga asks the server to cancel it first (any gateway replica finds it here)."""
        await self.marked()
        ledger = await self.saga._client()
        status = changed(self.entry.status, {"effect": EffectState.EXECUTING, "task": task})
        self.entry = await recorded(
            lambda: ledger.write_entry_status(self.entry, status), f"the task of step {self.name!r}"
        )

    def leaves(self, value: Any) -> None:
        """What the step left, as its guard (`register(..., guard=)`) selects it of its read: the
        compensation is sent only while the read gives this again. Unsaid, the undo halts as
        Conflict (nothing tells that a later change would not be overwritten)."""
        self.left = guards.left(value)

    @property
    def forward_key(self) -> str:
        return forward_key(self.saga.uid, self.name)

    @property
    def undo_id(self) -> str:
        return self.entry.spec.undo_id

    @property
    def entry_name(self) -> str:
        return self.entry.metadata.name


@dataclass
class SagaRun:
    kube: Kube
    saga: Saga
    owns_client: bool = False
    kubeconfig: str | None = None  # to reconnect after `async with` closed an owned client
    _positions: int = 0
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _ended: Outcome | None = None  # asked: no step may start
    _outcome_written: bool = False
    _failed_step: str | None = None
    _names: set[str] = field(default_factory=set)
    _token: contextvars.Token[SagaRun] | None = None
    _closed: bool = False
    _resumed_at: float | None = None  # monotonic: the saga was read to resume it, no step since
    _found_ended: str | None = None  # why a step's read found the saga ended: later steps write nothing

    @property
    def name(self) -> str:
        return self.saga.metadata.name

    @property
    def namespace(self) -> str:
        return self.saga.metadata.namespace

    @property
    def uid(self) -> str:
        return self.saga.metadata.uid

    @property
    def ledger(self) -> Ledger:
        return Ledger(self.kube)

    @property
    def last_position(self) -> int:
        """The stack position of the newest step registered (0: none yet)."""
        return self._positions

    async def _client(self) -> Ledger:
        """The ledger, reconnecting when the block already closed an owned client."""
        if self._closed:
            self.kube = await Kube.connect(self.kubeconfig)
            self._closed = False
        return self.ledger

    # -- steps -------------------------------------------------------------------------------

    async def register(
        self,
        step: str,
        compensation: Call | None,
        depends_on: Sequence[str] | None = None,
        *,
        guard: Guard | None = None,
        kubernetes: ObjectUndo | None = None,
    ) -> StepRun:
        """Write the step's UndoEntry (write-ahead); its effect is marked Executing if the step
        is still running IN_FLIGHT_MARK_AFTER later.

        Positions come from a lock-guarded counter, so concurrent tool calls get distinct,
        strictly increasing positions; AlreadyExists on a position is never retried silently.
        `depends_on` names steps registered before this one (see `step`). `guard`: what the step
        leaves is read again before its compensation (`StepRun.leaves` says what it was), and a
        later change there halts the undo as Conflict instead of being overwritten. `kubernetes`:
        the object the step changes, undone natively (see `undolog.sdk.objects.changing`).

        The saga is read while its entry is created (unless it was just read to resume it): one
        round trip, not two. If it ended, the entry is recorded NotSent and SagaEnded raised.
        """
        if self._ended:
            raise SagaEnded(f"saga {self.namespace}/{self.name} is {self._ended}: step {step!r} was not registered")
        if self._found_ended:
            raise SagaEnded(f"{self._found_ended}: step {step!r} was not registered or run")
        refused = step_name_refusal(step)
        if refused:
            raise ValueError(f"saga {self.namespace}/{self.name}: {refused}")
        typos(compensation, f"saga {self.namespace}/{self.name}: step {step!r}'s compensation")
        typos(guard, f"saga {self.namespace}/{self.name}: step {step!r}'s guard")
        ledger = await self._client()
        resumed, self._resumed_at = self._resumed_at, None
        fresh = resumed is not None and time.monotonic() - resumed <= RESUMED_FRESH_SECONDS
        refused = ended_refusal(self.saga, self.uid) if fresh else None
        if refused:
            raise SagaEnded(f"{refused}: step {step!r} was not registered or run")
        position, step = await self._position(step, depends_on)
        entry = new_undo_entry(
            self.saga,
            position,
            step,
            compensation,
            depends_on=None if depends_on is None else list(depends_on),
            guard=guard,
            kubernetes=kubernetes,
        )
        with tracing.span(
            f"undolog register {step}", {"undolog.saga": self.saga.reference, "undolog.position": position}
        ):
            run = StepRun(self, step, position, entry)
            if fresh:
                run.entry = await ledger.create_entry(entry)
                run.mark_when_slow(ledger)
                return run
            created, read = await asyncio.gather(
                ledger.create_entry(entry), ledger.saga(self.namespace, self.name), return_exceptions=True
            )
        await run.started_if_active(created, read, ledger)
        return run

    async def _position(self, step: str, depends_on: Sequence[str] | None) -> tuple[int, str]:
        """The step's stack position, and its name (made unique when the tool was called before)."""
        async with self._lock:
            unknown = sorted(set(depends_on or ()) - self._names)
            if unknown:
                raise ValueError(
                    f"step {step!r} depends_on {', '.join(unknown)}, which no step of saga {self.name} registered "
                    f"before it is called (known: {', '.join(sorted(self._names)) or 'none'})"
                )
            self._positions += 1
            position = self._positions
            if step in self._names:  # a tool called twice: each call its own step and forward key
                step = repeated_step(step, position)
            self._names.add(step)
            return position, step

    async def finish(self, run: StepRun, error: BaseException | None = None) -> None:
        """Record the effect's outcome: Committed with its output, or Failed with the error
        (NotSent when the agent raised NotSent: the call provably never left). A failed step's
        output, when the agent set one (a partial effect's identifier), is kept: its compensation
        may need it."""
        ledger = await self._client()
        await run.marked()
        output, omitted = kept_output(run.output)
        if error is None:
            changes: EntryStatusChange = {"effect": EffectState.COMMITTED, "output": output, "output_omitted": omitted}
        else:
            changes = {"effect": _failed_effect(error), "last_error": describe_error(error)[:4096]}
            if run.output is not None:
                changes |= {"output": output, "output_omitted": omitted}
        changes["executed_at"] = now()
        if run.left is not None:
            changes["guard"] = run.left
        status = changed(run.entry.status, changes)
        # Its output is what a compensation may need to find the effect: worth waiting out an outage.
        attributes = {"undolog.saga": self.saga.reference, "undolog.effect": str(changes["effect"])}
        with tracing.span(f"undolog record {run.name}", attributes):
            run.entry = await recorded(
                lambda: ledger.write_entry_status(run.entry, status), f"the outcome of step {run.name!r}"
            )

    @asynccontextmanager
    async def step(
        self,
        name: str,
        compensation: Call | None = None,
        *,
        depends_on: Sequence[str] | None = None,
        guard: Guard | None = None,
    ) -> AsyncIterator[StepRun]:
        """Register, run the body, record the outcome. An exception marks the effect Failed
        (its outcome may be partial, so it is still compensated) and propagates."""
        run = await self.register(name, compensation, depends_on, guard=guard)
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
        typos(call, f"saga {self.namespace}/{self.name}: effect {name!r}")
        ledger = await self._client()
        async with self._lock:
            try:
                self.saga = await ledger.stage_effect(self.namespace, self.name, Effect(name=name, call=call))
            except errors.Conflict as kept_changing:
                raise SagaEnded(kept_changing.message) from None

    async def commit(self) -> None:
        await self._end(Outcome.COMMIT, {})

    async def abort(self, reason: str, failed_step: str | None = None) -> None:
        annotations = {ABORT_REASON_ANNOTATION: reason[:1024]}
        if failed_step:
            annotations[FAILED_STEP_ANNOTATION] = failed_step
        await self._end(Outcome.ABORT, annotations)

    async def rewind_to(self, step_or_position: str | int, reason: str, within: float = 60.0) -> Saga:
        """Undo every step after `step_or_position` (a step name: its latest run is kept; or a
        stack position), newest first, and go on from there: the operator compensates them
        (phase Rewinding) and hands the saga back Active; steps called after this get new,
        higher positions and new forward keys. RewindNotDone if it was refused or the saga
        halted or failed meanwhile; TimeoutError after `within` seconds."""
        ledger = await self._client()
        self.saga = await ledger.saga(self.namespace, self.name)
        position = rewind.position_of(step_or_position, (await ledger.entries_of(self.saga)).entries)
        request = Rewind(to_position=position, reason=f"{reason[:900]} (at {now().isoformat()})")
        refused = rewind.may_request(self.saga, request)
        if refused:
            raise RewindNotDone(refused)
        self.saga = await ledger.request_rewind(self.namespace, self.name, request)

        def settled(saga: Saga) -> RewindStatus | None:
            self.saga = saga
            done = rewind.outcome(saga, request)
            if done is None and saga.status.phase in (*FINAL, SagaPhase.FAILED, SagaPhase.COMPENSATING):
                raise RewindNotDone(
                    f"saga {self.namespace}/{self.name} is {saga.status.phase} while rewinding: {saga.status.message}"
                )
            return done

        try:
            done = await until(self._reader(ledger), settled, within=within, poll=POLL_SECONDS)
        except WaitTimedOut:
            raise TimeoutError(f"saga {self.namespace}/{self.name} did not finish rewinding in {within} s") from None
        if done.state != RewindState.DONE:
            raise RewindNotDone(done.message or "rewind refused")
        return self.saga

    async def _end(self, outcome: Outcome, annotations: dict[str, str]) -> None:
        """Write the outcome (no step may start from now on); a failed write is written again
        by the next call, `abort()` or `commit()`."""
        if self._outcome_written:
            return
        self._ended = outcome
        ledger = await self._client()
        again = (
            f"`undolog abort {self.name} -n {self.namespace} --reason ...`, or abort() again"
            if outcome == Outcome.ABORT
            else "commit() again"
        )
        self.saga = await recorded(
            lambda: ledger.request_outcome(self.namespace, self.name, outcome, annotations),
            f"{outcome} of saga {self.namespace}/{self.name} (it stays Active until it is: {again})",
        )
        self._outcome_written = True

    async def wait(self, phases: tuple[SagaPhase, ...] = tuple(FINAL), within: float = 60.0) -> Saga:
        """Poll until the saga reaches one of `phases`; TimeoutError after `within` seconds.
        Works after the `async with` block too (it reconnects)."""
        ledger = await self._client()

        def settled(saga: Saga) -> Saga | None:
            self.saga = saga
            return saga if saga.status.phase in phases else None

        try:
            return await until(self._reader(ledger), settled, within=within, poll=POLL_SECONDS)
        except WaitTimedOut as late:
            wanted = " or ".join(phases)
            raise TimeoutError(f"saga {self.namespace}/{self.name} is {late.saga.status.phase}, not {wanted}") from None
        finally:
            if self._ended:
                await self.close()

    def _reader(self, ledger: Ledger) -> Callable[[], Awaitable[Saga]]:
        return functools.partial(ledger.saga, self.namespace, self.name)

    async def close(self) -> None:
        if self.owns_client and not self._closed:
            self._closed = True
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
    namespace: str | None = None,
    org: str | None = None,
    principal: str | None = None,
    deadline_seconds: int | None = None,
    policy: CompensationPolicy | None = None,
    ttl_seconds_after_finished: int | None = None,
    kube: Kube | None = None,
    kubeconfig: str | None = None,
    resume: bool = False,
) -> SagaRun:
    """Create an Active external saga (from KUBECONFIG, or in-cluster when unset), in
    `namespace`, else the kubeconfig context's namespace (in a pod: the pod's).

    `resume=True` (with `name`): when the saga exists and is still Active (an earlier run of
    this agent died inside its block), carry on with it as it is (its spec, its entries; new
    steps come after its last) instead of failing with AlreadyExists. SagaEnded if it ended.
    `ttl_seconds_after_finished`: how long the finished saga stays (else the operator's default).
    `principal`: who the saga is opened for (spec.principal; the MCP gateway names its caller)."""
    if (name is None) == (generate_name is None):
        raise ValueError("give exactly one of name or generate_name")
    if resume and name is None:
        raise ValueError("resume=True needs the saga's name")
    typos(policy, "open_saga's policy")
    owns = kube is None
    client = kube or await Kube.connect(kubeconfig)
    spec = SagaSpec(
        org_id=org,
        principal=principal,
        active_deadline_seconds=deadline_seconds,
        compensation_policy=policy or CompensationPolicy(),
        ttl_seconds_after_finished=ttl_seconds_after_finished,
    )
    namespace = namespace or default_namespace(kubeconfig)
    try:
        try:
            # The agent's trace, if it is in one: the operator's spans for this saga join it.
            traceparent = tracing.traceparent()
            annotations = {tracing.TRACEPARENT_ANNOTATION: traceparent} if traceparent else None
            created = await Ledger(client).create_saga(namespace, name, generate_name, spec, annotations)
        except errors.AlreadyExists as exists:
            if not resume:
                raise errors.AlreadyExists(
                    f"{exists.message}: an earlier run's saga? open_saga(..., resume=True) carries on with it",
                    status=exists.status,
                    reason=exists.reason,
                ) from None
            return await resumed_saga(client, namespace, str(name), owns=owns, kubeconfig=kubeconfig)
    except BaseException:
        if owns:
            await client.close()
        raise
    return SagaRun(client, created, owns_client=owns, kubeconfig=kubeconfig)


async def resumed_saga(
    kube: Kube,
    namespace: str,
    name: str,
    *,
    owns: bool = False,
    kubeconfig: str | None = None,
    last_position: int | None = None,
) -> SagaRun:
    """An Active external saga that exists, carried on with; SagaEnded if it ended. Its entries
    are listed for the last position unless the caller knows it (`last_position`: a position
    taken since by another writer shows as AlreadyExists when the next step registers)."""
    ledger = Ledger(kube)
    saga = await ledger.saga(namespace, name)
    if saga.spec.steps is not None:
        raise ValueError(f"saga {namespace}/{name} is orchestrated: the operator runs its steps, no agent resumes it")
    if saga.status.phase not in (None, SagaPhase.ACTIVE) or saga.spec.outcome:
        asked = f" (outcome {saga.spec.outcome})" if saga.spec.outcome else ""
        raise SagaEnded(f"saga {namespace}/{name} is {saga.status.phase or 'Active'}{asked}: it cannot be resumed")
    read_at = time.monotonic()
    if last_position is not None:
        return SagaRun(
            kube, saga, owns_client=owns, kubeconfig=kubeconfig, _positions=last_position, _resumed_at=read_at
        )
    entries = (await ledger.entries_of(saga)).entries
    return SagaRun(
        kube,
        saga,
        owns_client=owns,
        kubeconfig=kubeconfig,
        _positions=max((e.spec.stack_position for e in entries), default=0),
        _names={e.spec.step for e in entries},
        _resumed_at=read_at,
    )


def known_saga(kube: Kube, namespace: str, name: str, uid: str, last_position: int) -> SagaRun:
    """An external saga known by name and uid, and the last position its steps took, carried on
    with unread: its next step reads it while registering (SagaEnded if it ended meanwhile)."""
    saga = Saga(metadata=ObjectMeta(name=name, namespace=namespace, uid=uid), spec=SagaSpec())
    return SagaRun(kube, saga, _positions=last_position)


def ended_refusal(saga: Saga, uid: str) -> str | None:
    """Why no step may start in `saga` as read (None: it is Active, and the saga of uid `uid`)."""
    meta = saga.metadata
    if uid and meta.uid != uid:
        return f"saga {meta.namespace}/{meta.name} is another saga of that name now (uid {meta.uid})"
    if saga.status.phase in (None, SagaPhase.ACTIVE) and not saga.spec.outcome:
        return None
    asked = f" (outcome {saga.spec.outcome})" if saga.spec.outcome else ""
    return f"saga {meta.namespace}/{meta.name} is {saga.status.phase or 'Active'}{asked}"


def _failed_effect(error: BaseException) -> EffectState:
    if isinstance(error, NotSent):
        return EffectState.NOT_SENT
    return EffectState.ABANDONED if isinstance(error, TaskAbandoned) else EffectState.FAILED


async def unrecorded_step(run: SagaRun, position: int) -> StepRun:
    """The step `run` registered at `position` whose outcome is not recorded yet, to record it
    in a later request (an MCP server that asked for input before doing the call). SagaEnded if
    the saga ended meanwhile (its step is compensated as registered); ValueError if that step is
    not this saga's or its outcome is recorded."""
    ledger = await run._client()
    entry = await ledger.entry(run.namespace, f"{run.name}-{position}")
    effect = entry.status.effect
    if not owned_by(entry, run.uid) or effect not in (EffectState.PENDING, EffectState.EXECUTING):
        raise ValueError(f"step {position} of saga {run.namespace}/{run.name} is not open (effect {effect})")
    return StepRun(run, entry.spec.step, position, entry)


async def running_tasks(run: SagaRun) -> list[tuple[StepRun, EntryTask]]:
    """The saga's steps whose outcome waits on a server's task (MCP's tasks extension)."""
    ledger = await run._client()
    listing = await ledger.entries_of(run.saga)  # by its name and uid, which never change
    return [
        (StepRun(run, e.spec.step, e.spec.stack_position, e), e.status.task)
        for e in listing.entries
        if e.status.task is not None and e.status.effect in (EffectState.PENDING, EffectState.EXECUTING)
    ]


P = ParamSpec("P")


def undoable(
    compensation: Callable[..., Call | None] | None = None,
    *,
    step: str | None = None,
    depends_on: Sequence[str] | None = None,
) -> Callable[[Callable[P, Awaitable[T]]], Callable[P, Awaitable[T]]]:
    """Make an async tool undoable within the current saga.

    `compensation` gets the tool's own arguments and returns the Call that undoes it; it runs
    before the tool, so the undo is on the ledger before the effect can happen. A tool that
    returns a dict has it stored as the step's output (usable in `${steps.<name>.output...}`).
    Inside the tool, `current_step().forward_key` is the Idempotency-Key for its own call.
    `depends_on` (step names): only those earlier steps are undone after this one; the others
    may be undone alongside it (absent: it depends on every earlier step). The step is named
    `step`, else after the tool (`_CreateUser` is `createuser`); a tool called again in the
    same saga gets its position appended (`createuser-3`).
    """

    def wrap(tool: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
        name = step or step_name_of(tool.__name__)

        @functools.wraps(tool)
        async def run(*args: P.args, **kwargs: P.kwargs) -> T:
            saga = current_saga()
            undo = compensation(*args, **kwargs) if compensation else None
            async with saga.step(name, undo, depends_on=depends_on) as running:
                result = await tool(*args, **kwargs)
                if isinstance(result, dict):
                    running.output = result
                return result

        return run

    return wrap
