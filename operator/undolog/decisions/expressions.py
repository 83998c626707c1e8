"""CEL (the Common Expression Language, Kubernetes' own; Google's bindings of cel-cpp, with the
extension libraries Kubernetes enables, below) over a fixed set of variables: compiled once,
evaluated to plain JSON values, every failure an ExpressionError that names the expression. The
gateway's undo expressions, tenancy rules and policies are each such an environment over their
own variables."""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from typing import Any

from cel_expr_python import cel


class ExpressionError(ValueError):
    """An expression that does not compile or cannot be evaluated; the message names it."""


# The libraries Kubernetes enables in its CEL (CRD rules, admission policies), as far as
# cel-expr-python (cel-cpp) has them. It has not Kubernetes' own URL and quantity libraries, nor
# its `find`/`findAll` (regex.extract and regex.extractAll do that, in RE2, in linear time), and
# it declares `transformMap` without being able to evaluate it: refused at compile.
LIBRARIES = ("strings", "optional", "regex", "lists", "sets", "two-var-comprehensions", "encoders", "math", "bindings")
_CONFIG = "name: undolog\nextensions:\n" + "".join(f'  - name: "{name}"\n' for name in LIBRARIES)
_UNEVALUABLE = re.compile(r"\.\s*transformMap(Entry)?\s*\(")


class Environment:
    def __init__(self, variables: tuple[str, ...]) -> None:
        self.variables = variables
        config = cel.NewEnvConfigFromYaml(_CONFIG)
        self.env = cel.NewEnv(config=config, variables=dict.fromkeys(variables, cel.Type.DYN))

    def compile(self, source: str, shown: str) -> Any:
        """The program of `source` (a cel.Expression); ExpressionError naming it as `shown`."""
        if _UNEVALUABLE.search(source):
            raise ExpressionError(
                f"{shown} does not compile: transformMap and transformMapEntry are not available in this CEL (the "
                "Python bindings of cel-cpp cannot evaluate them); build the map with a literal, or transformList"
            )
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
    """CEL's values as JSON's (its maps may hold non-string keys: said as text; bytes as
    base64, as Kubernetes writes them)."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(bytes(value)).decode()
    return value
