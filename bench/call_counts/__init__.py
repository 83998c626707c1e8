"""Python function calls a controller makes per compensated saga, by package: a count that does
not move with the box's load, where its CPU per saga moved by a fifth from run to run. The
benchmark's Python processes are started with `environment(folder)` set; `counted(pid)` counts
while its block runs (cProfile's counts, taken in the process by sitecustomize.py here)."""

from __future__ import annotations

import asyncio
import os
import pstats
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

HERE = Path(__file__).parent
VARIABLE = "UNDOLOG_BENCH_CALL_COUNTS"
DUMP_SECONDS = 30.0  # the counts of a few hundred thousand calls are written well within this


def environment(folder: Path) -> dict[str, str]:
    """What the Python processes the benchmark starts need to be counted (sitecustomize.py)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = [str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {"PYTHONPATH": os.pathsep.join(paths), VARIABLE: str(folder)}


@asynccontextmanager
async def counted(pid: int) -> AsyncIterator[dict[str, int]]:
    """The calls Python process `pid` makes while the block runs, by package (filled in
    afterwards); nothing when the benchmark's processes were not started to be counted."""
    by_package: dict[str, int] = {}
    folder = Path(os.environ[VARIABLE]) if VARIABLE in os.environ else None
    if folder is None:
        yield by_package
        return
    written = folder / f"calls.{pid}"
    written.unlink(missing_ok=True)  # an earlier process's, under the same pid
    os.kill(pid, signal.SIGUSR1)
    try:
        yield by_package
    finally:
        os.kill(pid, signal.SIGUSR2)
        deadline = time.monotonic() + DUMP_SECONDS
        while not written.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"process {pid} wrote no call counts to {written} within {DUMP_SECONDS:g} s")
            await asyncio.sleep(0.05)
        by_package.update(packages(written))


def packages(path: Path) -> Counter[str]:
    """Calls by where the function called lives: undolog, a library (aiohttp, pydantic, ...),
    asyncio, the rest of the standard library, or C builtins (len, isinstance, dict.get, ...)."""
    stats = pstats.Stats(str(path)).stats  # type: ignore[attr-defined]
    calls: Counter[str] = Counter()
    for (file, _, _), (_, count, *_) in stats.items():
        calls[package_of(file)] += count
    return calls


def package_of(file: str) -> str:
    if file == "~":
        return "C builtins"
    if "/undolog/" in file:
        return "undolog"
    if "/site-packages/" in file:
        return file.split("/site-packages/", 1)[1].split("/", 1)[0]
    if "/asyncio/" in file:
        return "asyncio"
    if "/bench/" in file:
        return "bench"
    return "standard library (besides asyncio)"
