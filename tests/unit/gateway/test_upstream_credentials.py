"""The gateway's own credentials for an upstream (gateway/upstream_credentials.py), on the fake
API: read from their Secret, read again once they are due, the last good one kept while the
Secret cannot be read, and a start refused, naming the Secret, when it never could be."""

from __future__ import annotations

import ssl
from typing import cast

import httpx2
import pytest
from devtools.control_plane.pki import certificate_authority, client_certificate

from tests.support.fakes import FakeKube
from undolog.api.gateway import Upstream
from undolog.gateway.upstream_credentials import CredentialsUnreadable, UpstreamCredentials
from undolog.kube import Kube

TRACKER = Upstream.model_validate(
    {"url": "http://127.0.0.1:1/mcp", "credentials": {"headersFrom": {"name": "tracker-credentials"}}}
)


def stored(kube: FakeKube, token: str) -> None:
    kube.secrets[("agents", "tracker-credentials")] = ({}, {"Authorization": f"Bearer {token}".encode()})


async def sent(credentials: UpstreamCredentials) -> str:
    request = httpx2.Request("POST", "http://127.0.0.1:1/mcp")
    for hook in credentials.hooks("tracker"):
        await hook(request)
    return request.headers["authorization"]


async def test_the_secret_s_headers_go_with_each_request_and_a_rotation_once_it_is_read_again() -> None:
    kube = FakeKube()
    stored(kube, "first")
    credentials = UpstreamCredentials(
        {"tracker": TRACKER, "other": Upstream(url="http://127.0.0.1:2/mcp")}, cast(Kube, kube), "agents"
    )
    await credentials.read()
    assert await sent(credentials) == "Bearer first"
    assert credentials.hooks("other") == []
    stored(kube, "rotated")
    assert await sent(credentials) == "Bearer first"  # not read again before it is due
    credentials.by_upstream["tracker"].good_until = 0.0  # due
    assert await sent(credentials) == "Bearer rotated"
    del kube.secrets[("agents", "tracker-credentials")]
    credentials.by_upstream["tracker"].good_until = 0.0
    assert await sent(credentials) == "Bearer rotated"  # gone now: the last good one stays


async def test_a_secret_that_cannot_be_read_at_start_refuses_the_start_naming_it() -> None:
    credentials = UpstreamCredentials({"tracker": TRACKER}, cast(Kube, FakeKube()), "agents")
    with pytest.raises(
        CredentialsUnreadable, match=r"upstreams\.tracker\.credentials: Secret agents/tracker-credentials"
    ):
        await credentials.read()


async def test_a_client_certificate_goes_into_the_upstream_s_tls_context_and_a_broken_one_is_named() -> None:
    authority = certificate_authority("an authority")
    client = client_certificate(authority, "undolog-gateway")
    kube = FakeKube()
    pair = {"tls.crt": client.certificate_pem, "tls.key": client.key_pem, "ca.crt": authority.certificate_pem}
    kube.secrets[("agents", "tracker-certificate")] = ({}, pair)
    upstream = Upstream.model_validate(
        {"url": "https://127.0.0.1:1/mcp", "credentials": {"clientCertificate": {"name": "tracker-certificate"}}}
    )
    plain = Upstream(url="http://127.0.0.1:2/mcp")
    credentials = UpstreamCredentials({"tracker": upstream, "plain": plain}, cast(Kube, kube), "agents")
    await credentials.read()
    context = credentials.tls("tracker")
    assert isinstance(context, ssl.SSLContext)
    assert any(c["subject"] == ((("commonName", "an authority"),),) for c in context.get_ca_certs())
    assert credentials.tls("plain") is True
    kube.secrets[("agents", "tracker-certificate")] = ({}, {**pair, "tls.key": b"not a key"})
    broken = UpstreamCredentials({"tracker": upstream}, cast(Kube, kube), "agents")
    with pytest.raises(CredentialsUnreadable, match=r"holds no usable tls\.crt and tls\.key"):
        await broken.read()
