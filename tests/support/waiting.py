"""Waiting on a condition with a timeout (never sleep-and-hope)."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx

from undolog.kube import Body, Kube

T = TypeVar("T")


async def eventually(probe: Callable[[], Awaitable[T]], accept: Callable[[T], bool], within: float, what: str) -> T:
    deadline = time.monotonic() + within
    last: Any = None
    while time.monotonic() < deadline:
        seen = await probe()
        if accept(seen):
            return seen
        last = seen
        await asyncio.sleep(0.05)
    raise AssertionError(f"{what} not reached in {within} s; last seen: {last}")


def until_healthy(url: str, process: subprocess.Popen[bytes], log: Callable[[], str], within: float, what: str) -> None:
    """Until `url` answers 200 (a process's /healthz); fails at once, with its log, if it exits."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"{what} exited with {process.returncode}:\n{log()}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{what} not live after {within} s:\n{log()}")


async def saga_phase(kube: Kube, namespace: str, name: str, phase: str, within: float = 30.0) -> Body:
    """The saga in `phase` with its labels caught up (the label follows the status by one write)."""

    def settled(body: Body) -> bool:
        labels = body["metadata"].get("labels") or {}
        return body.get("status", {}).get("phase") == phase and labels.get("undolog.io/phase") == phase.lower()

    return await eventually(lambda: kube.get("sagas", namespace, name), settled, within, f"saga {name} phase {phase}")


def serving(url: str, process: subprocess.Popen[bytes], log: Path, within: float) -> None:
    """Until `url` answers 200; AssertionError with the end of the process's log when it exits
    or `within` seconds pass first (the process is killed then)."""
    deadline = time.monotonic() + within
    while True:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline or process.poll() is not None:
            process.kill()
            raise AssertionError(f"{url} did not answer in {within} s: {log.read_text()[-2000:]}")
        time.sleep(0.05)
