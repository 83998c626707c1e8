"""Moves that go forward: registering a step's entry before its call, sending it, and the
post-commit effects."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable

from undolog import errors
from undolog.api import Saga, UndoEntry
from undolog.controller.applying.phase import STARTED
from undolog.controller.applying.turn import Turn
from undolog.controller.saga_status import with_effect
from undolog.decisions import moves, phases

log = logging.getLogger("undolog.driver")


async def register_step(turn: Turn, move: moves.RegisterStep) -> Saga:
    entry, created = await turn.context.forwarder.register(turn.saga, move.position, move.step, again=move.again)
    turn.entries.put(entry)
    if created:
        turn.never_sent.add(entry.metadata.name)
    return await turn.status.counted(turn.saga, turn.entries)


async def execute_step(turn: Turn, move: moves.ExecuteStep) -> Saga:
    saga, entries, name = turn.saga, turn.entries, move.entry.metadata.name
    first_send = name in turn.never_sent
    turn.never_sent.discard(name)  # from here on an attempt may have left
    sending = turn.context.forwarder.execute(saga, entries[name], move.step, turn.outputs, first_send=first_send)
    if saga.status.phase is None:
        sent, saga = await active_if_slow(turn, sending)
        entries.put(sent)
    else:
        entries.put(await sending)
    return await turn.status.counted(saga, entries)


async def active_if_slow(turn: Turn, sending: Awaitable[UndoEntry]) -> tuple[UndoEntry, Saga]:
    """A step sent before the saga's Active status was written (phases.steps_before_active):
    should its call outlast the moment, Active is written meanwhile, so that a saga never
    shows no phase for as long as a slow participant takes."""
    saga = turn.saga
    call = asyncio.ensure_future(sending)
    try:
        created = saga.metadata.creation_timestamp or turn.context.clock.now()
        moment = (created + phases.ACTIVE_WRITE_AFTER - turn.context.clock.now()).total_seconds()
        done, _ = await asyncio.wait({call}, timeout=max(moment, 0.0))
        if not done:
            try:
                saga = await turn.status.enter(saga, turn.entries, STARTED)
            except errors.KubeError as error:  # the next decision writes Active instead
                log.info("saga %s/%s: Active not written yet: %s", *saga.key, error.message)
        return await call, saga
    finally:
        call.cancel()  # nothing when the call is over; a driver stopped takes its call with it


async def deliver_effect(turn: Turn, move: moves.DeliverEffect) -> Saga:
    delivered = await turn.context.forwarder.deliver(turn.saga, move.effect, turn.outputs)
    return await turn.status.write(turn.saga, with_effect(turn.saga.status, delivered))
