"""Webhooks as the operator last saw them, kept by a watch, so a call's target is found without a
read on the hot path (one ordered watch per watched namespace, or one for all).

The cache is a hint, never the last word: a function it does not know is read from the API before
a call is refused (a Webhook created a moment ago), and a call that failed on a cached target is
checked against the API before its failure is recorded (a Webhook fixed a moment ago); see
`Registry`. A Webhook this version cannot parse is left out, so the read reports it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

from pydantic import ValidationError

from undolog.api import Webhook
from undolog.kube import Body, Kube
from undolog.kube.watch import OrderedWatch, as_body

WebhookKey = tuple[str, str]  # (namespace, name)


@dataclass
class WebhookCache:
    kube: Kube
    namespaces: list[str]  # empty: all namespaces
    webhooks: dict[WebhookKey, Webhook] = field(default_factory=dict)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def start(self) -> None:
        """List consistently, then follow each stream in the background."""
        targets: list[str | None] = [*self.namespaces] or [None]
        for namespace in targets:
            stream = OrderedWatch(self.kube, "webhooks", namespace, as_body, self._event, self._relisted(namespace))
            await stream.sync()
            self.tasks.append(asyncio.create_task(stream.run(), name=f"webhooks of {namespace or 'all'}"))

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.tasks.clear()

    def get(self, namespace: str, name: str) -> Webhook | None:
        return self.webhooks.get((namespace, name))

    def _event(self, kind: str, body: Body) -> None:
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        parsed = None if kind == "DELETED" else _parse(body)
        if parsed is None:
            self.webhooks.pop(key, None)
        else:
            self.webhooks[key] = parsed

    def _relisted(self, namespace: str | None) -> Callable[[list[Body]], None]:
        """A fresh listing replaces what was held for its namespace (deletions missed included)."""

        def relisted(items: list[Body]) -> None:
            for key in [k for k in self.webhooks if namespace is None or k[0] == namespace]:
                del self.webhooks[key]
            for body in items:
                self._event("ADDED", body)

        return relisted


def _parse(body: Body) -> Webhook | None:
    try:
        return Webhook.model_validate(body)
    except ValidationError:
        return None
