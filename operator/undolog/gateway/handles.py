"""Sagas of MCP's stateless revision (2026-07-28): no session, so a mapped call without a saga
handle opens a saga, and one with a handle (decisions/saga_handles.py) adds its step to that
saga, read again from the ledger each time: any gateway replica with the handle key serves any
request, and a restart loses nothing. The handle is returned in the result (`_meta` and a line
of text the model reads) and removed from the arguments before the call goes upstream."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import mcp_types as types

from undolog.api.gateway import GatewayConfig
from undolog.decisions import saga_handles
from undolog.decisions.saga_handles import HandleRefusal, OpenRound, SagaHandle
from undolog.errors import AlreadyExists, NotFound, SagaEnded, UndoLogError
from undolog.gateway.bindings import SagaBinding, StepAt
from undolog.gateway.confirmations import CONFIRM_INPUT
from undolog.gateway.sessions import Opening
from undolog.gateway.steps import NotCalled
from undolog.gateway.task_wire import TaskCreated
from undolog.gateway.upstreams import Answer, Rounds
from undolog.kube import Kube
from undolog.sdk import SagaRun, open_saga
from undolog.sdk.saga import known_saga, resumed_saga

HANDLE_ARG = "undolog_saga"  # the argument an agent passes the handle in
HANDLE_META = "io.undolog/saga-handle"
HANDLE_PROPERTY = {
    "type": "string",
    "description": (
        "The UndoLog saga this call belongs to: the handle an earlier call's result gave (io.undolog/saga-handle). "
        "Without it the call starts a new saga."
    ),
}
REGISTER_TRIES = 3  # another replica took the same position at once: read the saga again
KNOWN_SAGAS = 10_000  # sagas whose last position this replica remembers (the oldest forgotten first)


class HandleRefused(UndoLogError):
    """The handle names no saga this client may extend: nothing was called."""


def advertised(tool: types.Tool) -> types.Tool:
    """The tool as a stateless agent sees it: its input schema takes the saga handle too."""
    schema = dict(tool.input_schema or {"type": "object"})
    schema["properties"] = {**(schema.get("properties") or {}), HANDLE_ARG: HANDLE_PROPERTY}
    return tool.model_copy(update={"input_schema": schema})


def said_handle(handle: str) -> types.TextContent:
    return types.TextContent(
        type="text", text=f"UndoLog saga handle: {handle} (pass it as {HANDLE_ARG} to keep later calls in this saga)"
    )


class HandleSagas:
    """The sagas of this gateway's handles: read from the ledger, opened there."""

    def __init__(self, config: GatewayConfig, kube: Kube, key: bytes, opening: Opening) -> None:
        self.config, self.kube, self.key, self.opening = config, kube, key, opening
        # The last position this replica registered in each saga, so a call needs no LIST of its
        # entries; a position another replica took since shows as AlreadyExists, and is re-read.
        self.positions: OrderedDict[str, int] = OrderedDict()

    def remember(self, run: SagaRun) -> None:
        self.positions[run.uid] = run.last_position
        self.positions.move_to_end(run.uid)
        while len(self.positions) > KNOWN_SAGAS:
            self.positions.popitem(last=False)

    def forget(self, run: SagaRun) -> None:
        self.positions.pop(run.uid, None)

    def handle_of(self, run: SagaRun, identity: str | None) -> str:
        return saga_handles.mint(self.key, SagaHandle(run.namespace, run.name, run.uid), identity)

    async def extended(self, text: str, identity: str | None, namespace: str) -> SagaRun:
        """The saga a handle stands for, to register a step in: unread when this replica knows its
        last position (read while the step's entry is created), else as `resumed`."""
        found = self._found(text, identity, namespace)
        last = self.positions.get(found.uid)
        if last is None:
            return await self.resumed(text, identity, namespace)
        return known_saga(self.kube, found.namespace, found.name, found.uid, last)

    def _found(self, text: str, identity: str | None, namespace: str) -> SagaHandle:
        found = saga_handles.opened(self.key, text, identity, namespace)
        if isinstance(found, HandleRefusal):
            raise HandleRefused(f"{HANDLE_ARG}: {found.message}; nothing was called")
        return found

    async def resumed(self, text: str, identity: str | None, namespace: str) -> SagaRun:
        """The saga a handle stands for, as the ledger has it now, if it is the caller's (minted
        for it, in its namespace); HandleRefused saying why not."""
        found = self._found(text, identity, namespace)
        saga = f"saga {found.namespace}/{found.name}"
        try:
            run = await resumed_saga(
                self.kube, found.namespace, found.name, last_position=self.positions.get(found.uid)
            )
        except NotFound:
            raise HandleRefused(f"{HANDLE_ARG}: {saga} is gone; nothing was called") from None
        except SagaEnded as ended:
            raise HandleRefused(
                f"{HANDLE_ARG}: {ended}; call without it to start a new saga. Nothing was called"
            ) from None
        if run.uid != found.uid:
            raise HandleRefused(f"{HANDLE_ARG}: {saga} is another saga of that name now; nothing was called")
        return run

    async def opened(self, namespace: str, identity: str | None) -> SagaRun:
        config = self.config
        await self.opening(identity, namespace)
        return await open_saga(
            generate_name="mcp-",
            namespace=namespace,
            org=config.org,
            principal=identity,
            deadline_seconds=config.deadline_seconds,
            kube=self.kube,
        )


class HandleBinding(SagaBinding):
    """A stateless request's saga: the handle's among its arguments, or, for the retry of a call
    whose server asked first, the open round's (its requestState); a new one without either."""

    carry_on = f"carry on with the same {HANDLE_ARG}"

    def __init__(
        self,
        sagas: HandleSagas,
        caller: tuple[str | None, str],
        text: object,
        carried: OpenRound | None,
        rounds: Rounds,
    ) -> None:
        self.sagas, self.carried, self.rounds = sagas, carried, rounds
        self.identity, self.namespace = caller  # who calls, and its namespace
        self.text = carried.handle if carried is not None else text
        self.confirmed = carried is not None and carried.confirmed

    async def named(self, tool: str) -> SagaRun:
        if not isinstance(self.text, str):
            raise HandleRefused(f"{tool} needs {HANDLE_ARG}: the handle a mapped call's result gave")
        return await self.sagas.resumed(self.text, self.identity, self.namespace)

    async def opened(self) -> SagaRun:
        run = await self._run()
        self.text = self.sagas.handle_of(run, self.identity)
        return run

    async def _run(self, registering: bool = False) -> SagaRun:
        """The request's saga; `registering` a new step, read only while its entry is created."""
        if self.text is None:
            return await self.sagas.opened(self.namespace, self.identity)
        if registering:
            return await self.sagas.extended(str(self.text), self.identity, self.namespace)
        return await self.sagas.resumed(str(self.text), self.identity, self.namespace)

    def meta(self, run: SagaRun) -> dict[str, Any]:
        return {HANDLE_META: self.sagas.handle_of(run, self.identity)}

    def ended(self, run: SagaRun) -> None:
        """The next call names its saga by its handle (read before its step), or opens one."""
        self.sagas.forget(run)

    async def step(self, tool: str, call: StepAt) -> Answer:
        carried = self.carried
        for tries in range(1, REGISTER_TRIES + 1):
            try:
                run = await self._run(registering=carried is None)
            except (ValueError, UndoLogError) as error:
                raise NotCalled(f"tool {tool} was not called: {error}") from error
            position = carried.position if carried is not None else run.last_position + 1
            handle = self.sagas.handle_of(run, self.identity)
            try:
                result = await call(run, position, {HANDLE_META: handle}, carried is not None)
            except NotCalled as refused:
                self.sagas.forget(run)
                if isinstance(refused.__cause__, AlreadyExists) and self.text is not None and tries < REGISTER_TRIES:
                    continue
                if isinstance(refused.__cause__, SagaEnded):
                    raise NotCalled(
                        f"{refused}; {HANDLE_ARG}: call without it to start a new saga. Nothing was called"
                    ) from refused.__cause__
                raise
            self.sagas.remember(run)
            return self._told(handle, position, result)
        raise AssertionError("unreachable")  # the loop returns or raises

    def _told(self, handle: str, position: int, result: Answer) -> Answer:
        """The handle in the result; a server's question sealed with the open step in its state."""
        if isinstance(result, types.CallToolResult):
            result.content = [*result.content, said_handle(handle)]
            return result
        if isinstance(result, TaskCreated):  # the handle is in its _meta
            return result
        state = saga_handles.seal_round(
            self.sagas.key, OpenRound(handle, position, result.request_state, self.confirmed)
        )
        return types.InputRequiredResult(input_requests=result.input_requests, request_state=state, meta=result.meta)


def binding(
    sagas: HandleSagas,
    caller: tuple[str | None, str],
    tool: str,
    arguments: dict[str, Any],
    request_state: str | None,
    responses: types.InputResponses | None,
) -> HandleBinding:
    """The binding of a stateless request: its handle taken out of `arguments`; NotCalled when
    its requestState claims to be the gateway's and is not."""
    carried = saga_handles.opened_round(sagas.key, request_state)
    if isinstance(carried, HandleRefusal):
        raise NotCalled(f"tool {tool} was not called: {carried.message}")
    answers = {k: v for k, v in (responses or {}).items() if k != CONFIRM_INPUT}
    rounds = Rounds(answers or None, carried.state if carried is not None else request_state)
    return HandleBinding(sagas, caller, arguments.pop(HANDLE_ARG, None), carried, rounds)
