"""What is said when a participant's breaker opens or closes: a gauge, an Event on its Webhook,
and its status (`kubectl get wh` shows it)."""

from __future__ import annotations

import asyncio
import logging

from undolog import errors, metrics
from undolog.api import EventReason, ParticipantState, WebhookStatus
from undolog.calls.webhook_cache import WebhookCache
from undolog.controller.timeline import Timeline
from undolog.conventions import clip, now
from undolog.decisions.outage import MAX_PROBE_SECONDS, OPEN_AFTER, Breaker, outage_budget
from undolog.ledger import Ledger

log = logging.getLogger("undolog.participants")


def budget_in_force(seconds: int | None) -> str:
    """The outage budget a Webhook's calls wait for, as a person reads it (its own, or the default)."""
    said = f"{outage_budget(seconds):g} s"
    return said if seconds is not None else f"{said}, the default"


class BreakerReport:
    """Says each change of a participant's breaker; its status writes run beside the calls."""

    def __init__(self, ledger: Ledger, timeline: Timeline, webhooks: WebhookCache) -> None:
        self.ledger, self.timeline, self.webhooks = ledger, timeline, webhooks
        self._writes: set[asyncio.Task[None]] = set()

    def changed(self, participant: str, breaker: Breaker, last_error: str | None) -> None:
        namespace, name = participant.split("/", 1)
        metrics.participant_unavailable.labels(namespace, name).set(1 if breaker.open else 0)
        webhook = self.webhooks.get(namespace, name)
        if webhook is None:
            return
        if breaker.open:
            message = (
                f"{OPEN_AFTER} calls in a row were not answered (last: {last_error}): compensations wait without "
                f"spending retries, one probe at a time (backing off to {MAX_PROBE_SECONDS:g} s), each for up to "
                f"spec.outageBudgetSeconds ({budget_in_force(webhook.spec.outage_budget_seconds)}) before its saga "
                "halts with "
                "ParticipantUnavailable"
            )
            self.timeline.record(webhook, EventReason.PARTICIPANT_UNAVAILABLE, message, warning=True)
            status = WebhookStatus(participant=ParticipantState.UNAVAILABLE, since=now(), message=clip(message))
        else:
            message = "answered again: the calls waiting for it go, at its pace (spec.limits)"
            self.timeline.record(webhook, EventReason.PARTICIPANT_AVAILABLE, message)
            status = WebhookStatus(participant=ParticipantState.AVAILABLE, since=now(), message=message)
        write = asyncio.create_task(self._write(namespace, name, status))
        self._writes.add(write)
        write.add_done_callback(self._writes.discard)

    async def _write(self, namespace: str, name: str, status: WebhookStatus) -> None:
        try:
            await self.ledger.write_webhook_status(namespace, name, status)
        except errors.KubeError as error:  # the Event and the gauge have said it already
            log.warning("Webhook %s/%s: its status was not written: %s", namespace, name, error.message)
