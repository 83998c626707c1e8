"""What keeps other web pages out of the dashboard: the Host it answers to, the Origin of its
forms, and the browser rules it sends (Content-Security-Policy, no framing).

In `--auth kubeconfig` mode the dashboard acts with the local user's credentials, so a page
that rebinds its DNS name to 127.0.0.1 could read it and press its buttons (tried: a retry was
carried out `by undolog-admin` with `Host: evil.example`). Bound to a loopback address, it
answers only to loopback names and `--allowed-host`; elsewhere (in a pod, behind an Ingress)
only to `--allowed-host` (and loopback names, for `kubectl port-forward`) when given.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable, Collection
from urllib.parse import urlsplit

from aiohttp import web
from aiohttp.typedefs import Middleware

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]", "::1"})
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        "frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return address == "localhost"


def host_name(host: str) -> str:
    """The name of a Host header without its port ([::1]:8000 -> [::1])."""
    if host.startswith("["):
        return host.split("]", 1)[0] + "]"
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def allowed_hosts(address: str, extra: Collection[str]) -> frozenset[str] | None:
    """The names the dashboard answers to; None: any (not bound to loopback, none given)."""
    names = {name.lower() for name in extra}
    if names or is_loopback(address):  # loopback names too: `kubectl port-forward` reaches it as localhost
        names |= LOOPBACK_NAMES
    return frozenset(names) if names else None


def guarded(allowed: frozenset[str] | None) -> Middleware:
    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        host = request.headers.get("Host", "")
        if allowed is not None and host_name(host).lower() not in allowed and request.path != "/healthz":
            raise web.HTTPMisdirectedRequest(
                text=f"this dashboard does not answer to Host {host!r}: start it with --allowed-host "
                f"{host_name(host)} if that is its name"
            )
        origin = request.headers.get("Origin")
        if request.method == "POST" and origin and urlsplit(origin).netloc.lower() != host.lower():
            raise web.HTTPForbidden(text=f"a form from {origin} is not this dashboard's: refused")
        return await handler(request)

    return guard


async def send_security_headers(_: web.Request, response: web.StreamResponse) -> None:
    """On every answer as it is sent (`on_response_prepare`): refusals, redirects and error
    pages are pages a browser renders or frames too, and a middleware never sees those raised."""
    response.headers.update(SECURITY_HEADERS)
