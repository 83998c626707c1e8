"""The gateway's door (gateway/protected.py): what a request to /mcp needs, and what it is told
when it has not got it; the principal it proves handed on in its scope."""

from __future__ import annotations

import json
from typing import Any, cast

from starlette.types import Message, Receive, Scope, Send

from undolog.api.gateway import Auth
from undolog.decisions.principals import Principal
from undolog.gateway.agent_requests import PRINCIPAL_SCOPE
from undolog.gateway.authentication import Authenticator, Refused, Unavailable
from undolog.gateway.protected import Protected

AUTH = Auth(resource="https://gateway.example/mcp", service_accounts=True)
ALICE = Principal("https://issuer.example/", "alice")


class Tokens:
    """An authenticator by table: a token's principal, or what it raises."""

    def __init__(self, known: dict[str, Principal | Exception]) -> None:
        self.known = known

    async def principal(self, token: str) -> Principal:
        found = self.known[token]
        if isinstance(found, Exception):
            raise found
        return found


class App:
    def __init__(self) -> None:
        self.scopes: list[Scope] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.scopes.append(scope)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})


async def call(door: Protected, path: str, token: str | None) -> tuple[int, dict[str, str], dict[str, Any]]:
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    await door({"type": "http", "path": path, "method": "POST", "headers": headers}, receive, send)
    start, body = sent[0], sent[1]
    said = {k.decode(): v.decode() for k, v in start["headers"]}
    return int(start["status"]), said, json.loads(body["body"])


def door(app: App, known: dict[str, Principal | Exception]) -> Protected:
    return Protected(app, "/mcp", AUTH, cast(Authenticator, Tokens(known)))


async def test_no_token_is_asked_for_naming_the_metadata_and_nothing_goes_on() -> None:
    app = App()
    status, headers, body = await call(door(app, {}), "/mcp", None)
    assert status == 401
    assert headers["www-authenticate"] == (
        'Bearer resource_metadata="https://gateway.example/.well-known/oauth-protected-resource/mcp"'
    )
    assert body["error_description"].startswith("a bearer token is required")
    assert app.scopes == []


async def test_a_refused_token_is_told_why_and_an_unreachable_checker_is_a_503_to_retry() -> None:
    app = App()
    known: dict[str, Principal | Exception] = {"old": Refused("the token expired at then"), "x": Unavailable("down")}
    status, headers, body = await call(door(app, known), "/mcp", "old")
    assert status == 401
    assert 'error="invalid_token", error_description="the token expired at then"' in headers["www-authenticate"]
    assert body == {"error": "invalid_token", "error_description": "the token expired at then"}
    status, headers, _ = await call(door(app, known), "/mcp", "x")
    assert (status, headers["retry-after"]) == (503, "5")
    assert app.scopes == []


async def test_a_proved_principal_goes_on_in_the_scope_and_other_paths_need_nothing() -> None:
    app = App()
    status, _, _ = await call(door(app, {"good": ALICE}), "/mcp", "good")
    assert status == 200
    assert app.scopes[0][PRINCIPAL_SCOPE] == ALICE
    assert app.scopes[0]["user"].access_token.token == ""  # the token is not kept past the door
    assert (await call(door(app, {}), "/healthz", None))[0] == 200
