"""`undolog mcp`: the MCP gateway in the foreground (its modules, and the `mcp` package, load
only here)."""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import Annotated

import typer

from undolog.cli.connection import connection


def mcp(
    ctx: typer.Context,
    config: Annotated[str, typer.Option("--config", help="The gateway's configuration (YAML): upstreams, tools.")],
    stdio: Annotated[bool, typer.Option(help="Serve one agent over stdin/stdout instead of HTTP.")] = False,
    port: Annotated[int, typer.Option(help="Port to serve streamable HTTP on (at /mcp).")] = 8090,
    address: Annotated[str, typer.Option(help="Address to listen on (0.0.0.0 in a pod).")] = "127.0.0.1",
    handle_key: Annotated[
        str | None,
        typer.Option(
            envvar="UNDOLOG_GATEWAY_HANDLE_KEY",
            help="The key that signs saga handles (stateless MCP, 2026-07-28); every replica needs the same one, "
            "and it must outlive restarts. Unset: a key of this process's own (handles die with it).",
        ),
    ] = None,
) -> None:
    """Serve MCP in front of your MCP servers: every tool call that can be undone gets its
    UndoEntry before it runs, and each session is a saga an abort undoes, newest first."""
    from undolog.api.gateway import AUTH_UNSAID
    from undolog.gateway.late_answers import drop_late_answers
    from undolog.gateway.run import MappingRefused, load, serve_http, serve_stdio
    from undolog.gateway.upstream_credentials import CredentialsUnreadable
    from undolog.gateway.upstreams import UpstreamUnreachable
    from undolog.kube import Kube

    try:
        loaded = load(config)
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--config") from None
    if loaded.auth is None and not stdio:
        raise typer.BadParameter(f"{config}: {AUTH_UNSAID}", param_hint="--config")
    user = connection(ctx)

    async def connect() -> Kube:
        return await Kube.connect(
            user.kubeconfig,
            user.context,
            as_user=user.as_user,
            as_groups=user.as_groups,
            request_timeout=user.request_seconds,
        )

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    drop_late_answers()
    if handle_key:
        key = handle_key.encode()
    else:
        key = secrets.token_bytes(32)
        logging.getLogger("undolog.gateway").warning(
            "no --handle-key (UNDOLOG_GATEWAY_HANDLE_KEY): saga handles are signed with a key of this process's own, "
            "so they do not survive its restart and another replica refuses them"
        )
    try:
        if stdio:
            asyncio.run(serve_stdio(loaded, connect, key))
        else:
            asyncio.run(serve_http(loaded, address, port, connect, key))
    except (MappingRefused, CredentialsUnreadable, UpstreamUnreachable) as refused:
        typer.echo(f"error: {config}: {refused}", err=True)
        raise typer.Exit(1) from None
