"""The gateway knows who calls: a bearer JWT of a configured issuer (Ory Hydra, a real
authorization server, issuing client-credentials tokens) or a ServiceAccount token of the
cluster (TokenRequest), each for the gateway's own resource URL. Anything else is refused 401
with the reason and the Protected Resource Metadata named, in both protocol eras, before
anything is called."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import httpx2
import jwt
import pytest
import pytest_asyncio
from cryptography.hazmat.primitives.asymmetric import rsa
from devtools.control_plane.local import free_port
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.cluster.test_mcp_gateway import tracker  # noqa: F401 (a fixture)
from tests.conftest import Cluster
from tests.support.gateway_process import GatewayProcess, gateway_config
from tests.support.hydra import Hydra
from tests.support.mcp_tracker import Tracker
from tests.support.waiting import eventually
from undolog.kube import Kube

pytestmark = pytest.mark.cluster
CLUSTER_ISSUER = "https://kubernetes.default.svc.cluster.local"  # the test control plane's (devtools)
STATELESS = "2026-07-28"


@pytest.fixture(scope="module")
def hydra(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hydra]:
    served = Hydra(tmp_path_factory.mktemp("hydra"))
    yield served
    served.stop()


class Authenticated:
    """A gateway that takes Hydra's tokens and the cluster's ServiceAccount tokens for its URL."""

    def __init__(self, cluster: Cluster, namespace: str, served: Tracker, hydra: Hydra, tmp_path: Path) -> None:
        port = free_port()
        self.resource = f"http://127.0.0.1:{port}/mcp"
        auth = {
            "resource": self.resource,
            "issuers": [{"issuer": hydra.issuer}],
            "serviceAccounts": True,
            "clockSkewSeconds": 0,
        }
        self.process = GatewayProcess(
            cluster.kubeconfig, gateway_config(namespace, served, auth=auth), tmp_path, port=port
        )


@pytest.fixture
def gateway(
    cluster: Cluster,
    namespace: str,
    tracker: Tracker,  # noqa: F811
    hydra: Hydra,
    tmp_path: Path,
) -> Iterator[Authenticated]:
    served = Authenticated(cluster, namespace, tracker, hydra, tmp_path)
    yield served
    served.process.stop()


@pytest_asyncio.fixture
async def service_account(kube: Kube, namespace: str) -> AsyncIterator[str]:
    await kube.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": "agent"}})
    yield "agent"


async def service_account_token(kube: Kube, namespace: str, name: str, audience: str) -> str:
    """A projected token of the ServiceAccount for `audience`, as the kubelet mounts one (TokenRequest)."""
    request = {"spec": {"audiences": [audience], "expirationSeconds": 600}}
    path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token"
    return str((await kube.request("POST", path, request))["status"]["token"])


def signed_elsewhere(claims: dict[str, Any], kid: str) -> str:
    """A JWT signed by a key nobody here publishes."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    now = int(time.time())
    return jwt.encode(
        {"iat": now, "nbf": now, "exp": now + 600, **claims}, key, algorithm="RS256", headers={"kid": kid}
    )


def raw_request(era: str) -> tuple[dict[str, str], dict[str, Any]]:
    """A first request of each era: the session's initialize, or a stateless tools/call."""
    headers = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
    if era == "session":
        params = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
        return headers, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": params}
    meta = {
        "io.modelcontextprotocol/protocolVersion": STATELESS,
        "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    params = {"name": "create_issue", "arguments": {"title": "never"}, "_meta": meta}
    headers |= {"mcp-protocol-version": STATELESS, "mcp-method": "tools/call", "mcp-name": "create_issue"}
    return headers, {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}


async def refused(gateway: Authenticated, token: str | None, reason: str) -> None:
    for era in ("session", "stateless"):
        headers, body = raw_request(era)
        if token is not None:
            headers["authorization"] = f"Bearer {token}"
        async with httpx.AsyncClient() as http:
            answer = await http.post(gateway.process.url, json=body, headers=headers, timeout=10)
        challenge = answer.headers.get("www-authenticate", "")
        print(f"\n{era}: {answer.status_code} {challenge}")
        assert answer.status_code == 401, answer.text
        assert "resource_metadata=" in challenge
        assert reason in answer.json()["error_description"], answer.json()
        assert token is None or reason in challenge


def agent(url: str, token: str, mode: str) -> Client:
    http = httpx2.AsyncClient(headers={"authorization": f"Bearer {token}"}, timeout=30)
    return Client(streamable_http_client(url, http_client=http), mode=mode)


async def test_a_token_that_proves_no_principal_is_refused_saying_why_and_nothing_is_called(
    kube: Kube,
    namespace: str,
    tracker: Tracker,  # noqa: F811
    hydra: Hydra,
    gateway: Authenticated,
    service_account: str,
) -> None:
    resource = gateway.resource
    hydra.client("short-lived", [resource], lifespan="1s")
    hydra.client("elsewhere", ["http://127.0.0.1:1/another-gateway"])
    expired = hydra.token("short-lived", resource)
    exp = jwt.decode(expired, options={"verify_signature": False})["exp"]
    await eventually(lambda: _now(), lambda now: now > exp, 10, "the short-lived token's exp passed")
    await refused(gateway, None, "a bearer token is required")
    await refused(gateway, expired, "the token expired at")
    await refused(gateway, hydra.token("elsewhere", "http://127.0.0.1:1/another-gateway"), "not this gateway")
    unknown_key = signed_elsewhere({"iss": hydra.issuer, "sub": "short-lived", "aud": [resource]}, "not-published")
    await refused(gateway, unknown_key, f"signed with a key {hydra.issuer} does not publish (kid 'not-published')")
    forged = signed_elsewhere(
        {"iss": CLUSTER_ISSUER, "sub": f"system:serviceaccount:{namespace}:agent", "aud": [resource]}, "forged"
    )
    await refused(gateway, forged, "the cluster does not accept it as a token for")
    await refused(gateway, "not-a-jwt", "not a JWT")
    assert tracker.issues.opened == {}
    assert await kube.list("sagas", namespace) == []
    # The same requests with a good token of each kind succeed, in both eras.
    tokens = [hydra.token(_client(hydra, resource), resource)]
    tokens.append(await service_account_token(kube, namespace, service_account, resource))
    for token in tokens:
        for mode in ("legacy", "auto"):
            async with agent(gateway.process.url, token, mode) as called:
                assert not (await called.call_tool("create_issue", {"title": f"{mode} {token[-6:]}"})).is_error
    assert len(tracker.issues.opened) == 4


async def test_the_protected_resource_metadata_names_the_gateway_and_its_issuers(
    hydra: Hydra, gateway: Authenticated
) -> None:
    async with httpx.AsyncClient() as http:
        answer = await http.get(f"{gateway.process.base}/.well-known/oauth-protected-resource/mcp", timeout=10)
    assert answer.status_code == 200
    metadata = answer.json()
    assert metadata["resource"] == gateway.resource
    assert metadata["authorization_servers"] == [hydra.issuer]


def _client(hydra: Hydra, resource: str) -> str:
    client_id = f"team-{uuid.uuid4().hex[:8]}"
    hydra.client(client_id, [resource])
    return client_id


async def _now() -> float:
    return time.time()
