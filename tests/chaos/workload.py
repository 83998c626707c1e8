"""The fault-injection workload: a mix of sagas against one participant, and the checks.

A third are external sagas (three committed entries, then aborted; every other one declares
entries 2 and 3 independent of each other, both depending on 1, so they are undone together), a
third orchestrated sagas refused at one step (so compensated), a third orchestrated sagas that
complete.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from tests.chaos.faults import TIMEOUT_SECONDS
from tests.chaos.invariants import Call, Report, check
from tests.support.manifests import call, saga, undo_entry
from tests.support.participants import Participant, Received
from tests.support.waiting import eventually
from undolog.kube import Kube

POLICY = {"backoff": {"initialMilliseconds": 50, "multiplier": 2, "maxMilliseconds": 1000, "maxRetries": 10}}
FINAL = ("Completed", "Compensated", "Halted")


@dataclass
class Workload:
    kube: Kube
    namespace: str
    participant: Participant
    sagas: int

    async def register(self) -> None:
        for function in ("do", "undo"):
            await self.kube.create(
                "webhooks",
                self.namespace,
                {
                    "apiVersion": "undolog.io/v1beta1",
                    "kind": "Webhook",
                    "metadata": {"name": function},
                    "spec": {
                        "versions": [{"name": "v1", "url": self.participant.url(f"/{function}")}],
                        "timeoutSeconds": TIMEOUT_SECONDS,
                    },
                },
            )

    async def start(self) -> None:
        await self.register()
        await asyncio.gather(*(self._one(i) for i in range(self.sagas)))

    async def _one(self, i: int) -> None:
        name = f"w{i:04d}"
        kind = i % 3
        if kind == 0:
            created = await self.kube.create("sagas", self.namespace, saga(name, compensationPolicy=POLICY))
            for position in (1, 2, 3):
                body = undo_entry(
                    name, position, owner_uid=created["metadata"]["uid"], compensation=call("undo", n=position)
                )
                body["spec"]["effectId"] = f"{created['metadata']['uid']}:step{position}:fwd"
                if (i // 3) % 2 and position > 1:
                    body["spec"]["dependsOn"] = ["step1"]
                await self.kube.create("undoentries", self.namespace, body)
                await self.kube.patch_status(
                    "undoentries", self.namespace, f"{name}-{position}", {"status": {"effect": "Committed"}}
                )
            await self.kube.patch("sagas", self.namespace, name, {"spec": {"outcome": "Abort"}})
            return
        failing = (i // 3) % 3 + 1 if kind == 1 else None
        steps = [
            {
                "name": f"s{p}",
                "action": {"function": "do", "args": {"step": p, **({"fail": True} if p == failing else {})}},
                "compensation": {"function": "undo", "args": {"step": p}},
            }
            for p in (1, 2, 3)
        ]
        await self.kube.create("sagas", self.namespace, saga(name, steps, compensationPolicy=POLICY))

    async def unfinished(self) -> list[str]:
        """The sagas not yet final (one placeholder per saga not created yet)."""
        sagas = await self.kube.list("sagas", self.namespace)
        stuck = [s["metadata"]["name"] for s in sagas if s.get("status", {}).get("phase") not in FINAL]
        return stuck + ["(not created yet)"] * (self.sagas - len(sagas))

    async def settled(self, within: float) -> list[dict[str, Any]]:
        await eventually(self.unfinished, lambda stuck: not stuck, within, f"all {self.sagas} sagas final")
        return await self.kube.list("sagas", self.namespace)

    async def report(self, sagas: list[dict[str, Any]]) -> Report:
        entries = await self.kube.list("undoentries", self.namespace)
        return check(sagas, entries, *participant_calls(self.participant))


def participant_calls(participant: Participant) -> tuple[list[Call], list[Call]]:
    """The forward and compensation calls that reached the workload's participant."""
    forward, undo = ([as_call(r) for r in participant.received(path)] for path in ("/do", "/undo"))
    return forward, undo


def as_call(request: Received) -> Call:
    return Call(
        key=request.key,
        saga=request.headers.get("undolog-saga", ""),
        step=request.headers.get("undolog-step", ""),
        at=request.at,
        replied=request.replied,
    )
