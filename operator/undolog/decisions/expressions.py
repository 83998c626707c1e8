"""CEL (the Common Expression Language, Kubernetes' own; Google's bindings of cel-cpp) over a
fixed set of variables: compiled once, evaluated to plain JSON values, every failure an
ExpressionError that names the expression. The gateway's undo expressions, tenancy rules and
policies are each such an environment over their own variables."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cel_expr_python import cel


class ExpressionError(ValueError):
    """An expression that does not compile or cannot be evaluated; the message names it."""


class Environment:
    def __init__(self, variables: tuple[str, ...]) -> None:
        self.variables = variables
        self.env = cel.NewEnv(variables=dict.fromkeys(variables, cel.Type.DYN))

    def compile(self, source: str, shown: str) -> Any:
        """The program of `source` (a cel.Expression); ExpressionError naming it as `shown`."""
        try:
            return self.env.compile(source)
        except RuntimeError as error:
            said = str(error).split("ERROR: ", 1)[-1].split(" [INVALID_ARGUMENT]")[0]
            raise ExpressionError(f"{shown} does not compile: {' '.join(said.split())}") from None

    def evaluate(self, program: Any, variables: Mapping[str, Any], shown: str) -> Any:
        """Its value over `variables` (the missing ones null), as JSON's values."""
        data = {name: variables.get(name) for name in self.variables}
        try:
            value = program.eval(data=data)
        except RuntimeError as error:
            raise ExpressionError(f"{shown} cannot be evaluated: {error}") from None
        if value.type() == cel.Type.ERROR:
            raise ExpressionError(f"{shown} cannot be evaluated: {value.plain_value()}")
        return plain(value.plain_value())


def plain(value: Any) -> Any:
    """CEL's values as JSON's (its maps may hold non-string keys: said as text)."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value
