"""The gateway's /mcp as an OAuth 2.1 protected resource (MCP's authorization, RFC 9728 and
RFC 6750): a request whose bearer token proves no principal is refused 401, its
WWW-Authenticate naming the Protected Resource Metadata (served beside it, by the `mcp`
package's route) and saying why; one that proves a principal goes on with it in its ASGI scope,
where the request path reads it (agent_requests.py) and the SDK binds a session to it. The
token itself goes no further than this door: upstreams are called with the gateway's own
credentials."""

from __future__ import annotations

import json
import logging

from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.routes import build_resource_metadata_url, create_protected_resource_routes
from pydantic import AnyHttpUrl
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from undolog.api.gateway import Auth
from undolog.decisions.principals import Principal
from undolog.gateway.agent_requests import PRINCIPAL_SCOPE
from undolog.gateway.authentication import Authenticator, Refused, Unavailable

RETRY_SECONDS = 5
log = logging.getLogger("undolog.gateway")


def metadata_routes(auth: Auth, servers: list[str]) -> list[Route]:
    """RFC 9728's document at /.well-known/oauth-protected-resource<resource path>."""
    return create_protected_resource_routes(AnyHttpUrl(auth.resource), [AnyHttpUrl(s) for s in servers])


def bearer(scope: Scope) -> str | None:
    for name, value in scope.get("headers", []):
        if name.lower() == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.strip() if scheme.lower() == "bearer" and token.strip() else None
    return None


def _quoted(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', "'")


class Protected:
    """The app, its `path` served only to requests whose token proves a principal."""

    def __init__(self, app: ASGIApp, path: str, auth: Auth, authenticator: Authenticator) -> None:
        self.app, self.path, self.authenticator = app, path, authenticator
        self.metadata = str(build_resource_metadata_url(AnyHttpUrl(auth.resource)))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].rstrip("/") != self.path:
            return await self.app(scope, receive, send)
        token = bearer(scope)
        if token is None:
            return await self._refuse(send, 401, None, "a bearer token is required (Authorization: Bearer <token>)")
        try:
            principal = await self.authenticator.principal(token)
        except Refused as refused:
            log.info("a request to %s refused: %s", self.path, refused)
            return await self._refuse(send, 401, "invalid_token", str(refused))
        except Unavailable as unavailable:
            log.warning("a request to %s could not be authenticated: %s", self.path, unavailable)
            return await self._refuse(send, 503, "temporarily_unavailable", str(unavailable))
        await self.app({**scope, "user": _user(principal), PRINCIPAL_SCOPE: principal}, receive, send)

    async def _refuse(self, send: Send, status: int, error: str | None, why: str) -> None:
        challenge = f'Bearer resource_metadata="{self.metadata}"'
        if error is not None:
            challenge = (
                f'Bearer error="{error}", error_description="{_quoted(why)}", resource_metadata="{self.metadata}"'
            )
        body = json.dumps({"error": error or "invalid_request", "error_description": why}).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"www-authenticate", challenge.encode("latin-1", "replace")),
        ]
        if status == 503:
            headers.append((b"retry-after", str(RETRY_SECONDS).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _user(principal: Principal) -> AuthenticatedUser:
    """The SDK's view of the caller: a session is bound to it, and refused to anyone else (the
    token itself is not kept there: nothing after this door needs it)."""
    access = AccessToken(
        token="",
        client_id=principal.name,
        scopes=[],
        expires_at=principal.expires_at,
        subject=principal.subject,
        claims={"iss": principal.issuer},
    )
    return AuthenticatedUser(access)
