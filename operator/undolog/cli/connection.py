"""The options that say who a command acts as and where, declared once: every command that
talks to the API takes them after its name, as kubectl's commands do, and finds them in
`ctx.obj` (a `Connection`)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any

import typer
from typer.core import TyperCommand


@dataclass(frozen=True)
class Connection:
    kubeconfig: str | None = None
    context: str | None = None
    as_user: str | None = None
    as_groups: tuple[str, ...] = ()
    request_timeout: str | None = None  # kubectl's: 0 (none), 30, 30s, 2m, 1h
    namespace: str | None = None  # -n, on the commands that take it

    @property
    def request_seconds(self) -> float | None:
        """--request-timeout in seconds (None: the client's own bound); BadParameter naming it."""
        text = (self.request_timeout or "").strip()
        if not text:
            return None
        if text == "0":
            return float(TIMEOUT_NONE)
        found = re.fullmatch(r"([0-9]+)(s|m|h)?", text)
        if not found:
            raise typer.BadParameter(
                f"{text!r} is not a duration such as 30s, 2m or 1h", param_hint="--request-timeout"
            )
        return int(found.group(1)) * {"s": 1, "m": 60, "h": 3600, None: 1}[found.group(2)]


def _user(
    context: Annotated[str | None, typer.Option("--context", help="The kubeconfig context to use.")] = None,
    # Not read from KUBECONFIG here: the client reads that list itself and merges its files.
    kubeconfig: Annotated[
        str | None,
        typer.Option("--kubeconfig", help="The kubeconfig file to use (default: KUBECONFIG's files, merged)."),
    ] = None,
    as_user: Annotated[str | None, typer.Option("--as", help="Impersonate this user (the API checks you may).")] = None,
    as_groups: Annotated[
        list[str] | None, typer.Option("--as-group", help="Impersonate this group (repeatable).")
    ] = None,
    request_timeout: Annotated[
        str | None,
        typer.Option("--request-timeout", help="How long one request may take (30s, 2m; 0: no limit)."),
    ] = None,
) -> None:
    """The options themselves (typer turns this signature into them once)."""


def _namespace(
    namespace: Annotated[
        str | None, typer.Option("--namespace", "-n", help="The namespace (default: the kubeconfig context's).")
    ] = None,
) -> None:
    """-n, for the commands that act in one namespace."""


def _options(*declared: Any) -> tuple[Any, ...]:
    """The options typer makes of these functions' parameters."""
    made = typer.Typer()
    for function in declared:
        made.command(function.__name__)(function)
    group = typer.main.get_group(made)
    return tuple(param for name in group.list_commands(typer.Context(group)) for param in group.commands[name].params)


TIMEOUT_NONE = 10 * 365 * 24 * 3600  # "0": no limit, as kubectl means it (aiohttp takes a number)


class UserCommand(TyperCommand):
    """A command that acts as the kubeconfig's user (or one it impersonates)."""

    shared: tuple[Any, ...] = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.params.extend(self.shared)

    def invoke(self, ctx: Any) -> Any:
        values = {param.name: ctx.params.pop(param.name) for param in self.shared}
        values["as_groups"] = tuple(values.get("as_groups") or ())
        ctx.obj = Connection(**values)
        return super().invoke(ctx)


class NamespacedCommand(UserCommand):
    """A command that also acts in one namespace (-n)."""


UserCommand.shared = _options(_user)
NamespacedCommand.shared = _options(_namespace, _user)


def connection(ctx: typer.Context) -> Connection:
    found = ctx.obj
    assert isinstance(found, Connection), "a command that connects is registered with cls=UserCommand"
    return found
