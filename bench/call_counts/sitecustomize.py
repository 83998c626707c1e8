"""Loaded at start by the Python processes a benchmark runs with `bench.call_counts.environment`
(this folder first on PYTHONPATH): SIGUSR1 starts counting every Python function call,
SIGUSR2 stops and writes the counts (cProfile's) to the folder the environment names, as
calls.<pid>. Not loaded anywhere else."""

import cProfile
import os
import signal
from pathlib import Path

_FOLDER = os.environ.get("UNDOLOG_BENCH_CALL_COUNTS")
_COUNTING: list[cProfile.Profile] = []


def _start(*_: object) -> None:
    profile = cProfile.Profile()
    _COUNTING.append(profile)
    profile.enable()


def _stop(*_: object) -> None:
    if _COUNTING and _FOLDER:
        profile = _COUNTING.pop()
        profile.disable()
        written = Path(_FOLDER) / f"calls.{os.getpid()}"
        partial = Path(f"{written}.partial")
        profile.dump_stats(partial)
        partial.rename(written)  # whole, or not there


if _FOLDER:
    signal.signal(signal.SIGUSR1, _start)
    signal.signal(signal.SIGUSR2, _stop)
