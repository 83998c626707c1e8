"""A guard's `holds`: CEL over `state` (a read's output) selecting what must still hold."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from undolog.decisions.expressions import Environment, ExpressionError

_ENV = Environment(("state",))


@lru_cache(maxsize=256)
def _program(source: str) -> Any:
    return _ENV.compile(source, f"guard {source!r}")


def check(source: str) -> None:
    """ExpressionError when `holds` does not compile (a configuration is refused on it)."""
    _program(source)


def selected(holds: str | None, state: Any) -> Any:
    """What `holds` selects of a read's output (the whole output without it); ExpressionError
    when it cannot be evaluated there."""
    if holds is None:
        return state
    return _ENV.evaluate(_program(holds), {"state": state}, f"guard {holds!r}")


__all__ = ["ExpressionError", "check", "selected"]
