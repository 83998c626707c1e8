"""Sagas of MCP's stateless revision (2026-07-28): no session, so a mapped call without a saga
handle opens a saga, and one with a handle (decisions/saga_handles.py) adds its step to that
saga, read again from the ledger each time: any gateway replica with the handle key serves any
request, and a restart loses nothing. The handle is returned in the result (`_meta` and a line
of text the model reads) and removed from the arguments before the call goes upstream."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import mcp_types as types

from undolog.api.gateway import GatewayConfig, ToolRule
from undolog.decisions import saga_handles
from undolog.decisions.saga_handles import HandleRefusal, OpenRound, SagaHandle
from undolog.errors import AlreadyExists, NotFound, SagaEnded, UndoLogError
from undolog.gateway.sessions import NotCalled, call_as_step, plan_text
from undolog.gateway.upstreams import Rounds, Upstreams, UpstreamTool
from undolog.kube import Kube
from undolog.sdk import SagaRun, open_saga
from undolog.sdk.saga import resumed_saga

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
    def __init__(self, config: GatewayConfig, kube: Kube, upstreams: Upstreams, key: bytes) -> None:
        self.config, self.kube, self.upstreams, self.key = config, kube, upstreams, key
        # The last position this replica registered in each saga, so a call needs no LIST of its
        # entries; a position another replica took since shows as AlreadyExists, and is re-read.
        self.positions: OrderedDict[str, int] = OrderedDict()

    def _remember(self, run: SagaRun) -> None:
        self.positions[run.uid] = run.last_position
        self.positions.move_to_end(run.uid)
        while len(self.positions) > KNOWN_SAGAS:
            self.positions.popitem(last=False)

    def handle_of(self, run: SagaRun, identity: str | None) -> str:
        return saga_handles.mint(self.key, SagaHandle(run.namespace, run.name, run.uid), identity)

    async def resumed(self, text: str, identity: str | None) -> SagaRun:
        """The saga a handle stands for, as the ledger has it now; HandleRefused saying why not."""
        found = saga_handles.opened(self.key, text, identity, self.config.namespace)
        if isinstance(found, HandleRefusal):
            raise HandleRefused(f"{HANDLE_ARG}: {found.message}; nothing was called")
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

    async def opened(self) -> SagaRun:
        config = self.config
        return await open_saga(
            generate_name="mcp-",
            namespace=config.namespace,
            org=config.org,
            deadline_seconds=config.deadline_seconds,
            kube=self.kube,
        )

    async def run_for(self, arguments: dict[str, Any], identity: str | None) -> SagaRun:
        """The saga of the handle among the arguments, or a new one whose handle is put there."""
        text = arguments.get(HANDLE_ARG)
        if text is not None:
            return await self.resumed(str(text), identity)
        run = await self.opened()
        arguments[HANDLE_ARG] = self.handle_of(run, identity)
        return run

    async def call(
        self,
        tool: UpstreamTool,
        arguments: dict[str, Any],
        rule: ToolRule | None,
        identity: str | None,
        rounds: Rounds,
        carried: OpenRound | None = None,
        confirmed: bool = False,
    ) -> types.CallToolResult | types.InputRequiredResult:
        """The call as a step of the handle's saga (a new one without a handle), or, when it is
        the retry of one whose server asked for input first (`carried`), recorded on its step.
        `confirmed`: the user allowed it, which a question of the server's carries on."""
        text = carried.handle if carried is not None else arguments.get(HANDLE_ARG)
        arguments.pop(HANDLE_ARG, None)
        for tries in range(1, REGISTER_TRIES + 1):
            try:
                run = await self.resumed(str(text), identity) if text is not None else await self.opened()
            except (ValueError, UndoLogError) as error:
                raise NotCalled(f"tool {tool.qualified} was not called: {error}") from error
            handle = self.handle_of(run, identity)
            position = carried.position if carried is not None else run.last_position + 1
            meta = {HANDLE_META: handle}
            try:
                result = await call_as_step(
                    run, self.upstreams, tool, arguments, rule, position, meta, rounds, carried is not None
                )
            except NotCalled as refused:
                self.positions.pop(run.uid, None)
                if isinstance(refused.__cause__, AlreadyExists) and text is not None and tries < REGISTER_TRIES:
                    continue
                raise
            self._remember(run)
            if isinstance(result, types.CallToolResult):
                result.content = [*result.content, said_handle(handle)]
                return result
            # The server asks first: its question goes to the agent, the open step in its state.
            state = saga_handles.seal_round(self.key, OpenRound(handle, position, result.request_state, confirmed))
            return types.InputRequiredResult(
                input_requests=result.input_requests, request_state=state, meta=result.meta
            )
        raise AssertionError("unreachable")  # the loop returns or raises

    async def own(self, tool: str, arguments: dict[str, Any], identity: str | None) -> str:
        """The agent's own tools on the handle's saga: commit, abort, rewind, status."""
        text = arguments.get(HANDLE_ARG)
        if not isinstance(text, str):
            raise HandleRefused(f"{tool} needs {HANDLE_ARG}: the handle a mapped call's result gave")
        run = await self.resumed(text, identity)
        saga = f"saga {run.namespace}/{run.name}"
        if tool == "undolog_commit":
            await run.commit()
            return f"{saga} committed: its steps stay done"
        if tool == "undolog_abort":
            reason = str(arguments.get("reason") or "aborted by the agent")
            plan = await plan_text(self.kube, run)
            await run.abort(reason)
            return f"{saga} aborted ({reason}); the operator undoes, newest first: {plan}"
        if tool == "undolog_rewind":
            to_step = str(arguments.get("to_step", ""))
            await run.rewind_to(
                int(to_step) if to_step.isdigit() else to_step, str(arguments.get("reason") or "rewind")
            )
            return f"{saga} rewound to {to_step}: the steps after it are undone; carry on with the same {HANDLE_ARG}"
        return f"{saga}; undone on abort, newest first: {await plan_text(self.kube, run)}"
