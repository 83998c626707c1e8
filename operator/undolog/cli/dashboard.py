"""`undolog dashboard`: the triage dashboard in the foreground (its modules load only here)."""

from __future__ import annotations

import logging
from enum import StrEnum
from typing import Annotated

import typer

from undolog.cli.connection import connection


class Auth(StrEnum):
    kubeconfig = "kubeconfig"
    token = "token"
    proxy = "proxy"


def dashboard(
    ctx: typer.Context,
    port: Annotated[int, typer.Option(help="Port to serve on.")] = 8000,
    address: Annotated[str, typer.Option(help="Address to listen on (0.0.0.0 in a pod).")] = "127.0.0.1",
    auth: Annotated[
        Auth,
        typer.Option(
            help="kubeconfig: act as the kubeconfig's user (one person, locally). token: act with the bearer "
            "token each request carries, or one pasted on the login page (in a cluster). proxy: act with the "
            "token an authenticating proxy (OIDC) passes in --token-header, and only with it."
        ),
    ] = Auth.kubeconfig,
    token_header: Annotated[
        str, typer.Option(help="With --auth proxy: the header the proxy passes the token in (oauth2-proxy's).")
    ] = "X-Forwarded-Access-Token",
    api_server: Annotated[
        str | None, typer.Option(help="With --auth token: the API's URL (in a pod: found by itself).")
    ] = None,
    api_ca_file: Annotated[
        str | None, typer.Option(help="With --auth token: the CA that signed the API's certificate.")
    ] = None,
    allowed_host: Annotated[
        list[str] | None,
        typer.Option(
            help="A Host name the dashboard answers to (repeatable): its Ingress's or Service's name. Bound to "
            "loopback it answers to loopback names only, else to any unless this is given."
        ),
    ] = None,
    base_path: Annotated[
        str,
        typer.Option(
            help="The path prefix it is served under (/undolog), behind a proxy that passes the path on as it "
            "came; /healthz stays at the root."
        ),
    ] = "",
    archive_dsn: Annotated[
        str | None,
        typer.Option(
            envvar="UNDOLOG_ARCHIVE_DSN",
            help="The archive's PostgreSQL (a libpq connection string): the History view, and the sagas gone "
            "from the cluster.",
        ),
    ] = None,
) -> None:
    """Serve the triage dashboard: halted sagas first, their undo stacks live, retry/skip/abort
    with a reason, with your own permissions."""
    from undolog.dashboard.server import base_path as prefix
    from undolog.dashboard.server import serve
    from undolog.dashboard.viewers import KubeconfigViewer, ProxyViewers, TokenViewers, Viewers

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        base = prefix(base_path)
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--base-path") from None
    viewers: Viewers
    if auth in (Auth.token, Auth.proxy):
        try:
            viewers = (
                ProxyViewers.behind(token_header, api_server, api_ca_file)
                if auth == Auth.proxy
                else TokenViewers.in_cluster(api_server, api_ca_file)
            )
        except ValueError as error:
            raise typer.BadParameter(str(error)) from None
    else:
        user = connection(ctx)
        viewers = KubeconfigViewer(user.kubeconfig, user.context, user.as_user, user.as_groups)
    from undolog.archive import ArchiveStore

    serve(viewers, address, port, ArchiveStore(archive_dsn) if archive_dsn else None, allowed_host or (), base)
