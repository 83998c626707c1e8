"""A guard's `holds`: CEL over `state` (a read's output) and `args` (the step's arguments)
selecting what must still hold."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from undolog.decisions.expressions import Environment, ExpressionError

_ENV = Environment(("state", "args"))
_READS_ARGS = re.compile(r"(?<![\w.])args\b")


@lru_cache(maxsize=256)
def _program(source: str) -> Any:
    return _ENV.compile(source, f"guard {source!r}")


def check(source: str) -> None:
    """ExpressionError when `holds` does not compile (a configuration is refused on it)."""
    _program(source)


def reads_args(holds: str | None) -> bool:
    """Whether `holds` reads the step's arguments (then the guard keeps them)."""
    return holds is not None and _READS_ARGS.search(holds) is not None


def selected(holds: str | None, state: Any, args: Any = None) -> Any:
    """What `holds` selects of a read's output (the whole output without it); ExpressionError
    when it cannot be evaluated there."""
    if holds is None:
        return state
    return _ENV.evaluate(_program(holds), {"state": state, "args": args}, f"guard {holds!r}")


__all__ = ["ExpressionError", "check", "reads_args", "selected"]
