"""The gateway knows who calls: a bearer JWT of a configured issuer (Ory Hydra, a real
authorization server, issuing client-credentials tokens) or a ServiceAccount token of the
cluster (TokenRequest), each for the gateway's own resource URL. Anything else is refused 401
with the reason and the Protected Resource Metadata named, in both protocol eras, before
anything is called."""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
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
from devtools.control_plane.pki import certificate_authority, client_certificate, serving_certificate
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from tests.cluster.test_cli import undolog
from tests.cluster.test_mcp_catalog import serving_operator_calls
from tests.cluster.test_mcp_gateway import AGENT, close_issue_webhook, tracker  # noqa: F401 (fixtures)
from tests.cluster.test_mcp_stateless import HANDLE, confirming, handle_of, text
from tests.conftest import Cluster
from tests.support.gateway_process import GatewayProcess, gateway_config
from tests.support.hydra import Hydra
from tests.support.manifests import webhook
from tests.support.mcp_tracker import Tracker
from tests.support.namespaces import fresh_namespace
from tests.support.operator_process import OperatorProcess
from tests.support.waiting import eventually, saga_phase
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


def agent(url: str, token: str, mode: str, **callbacks: Any) -> Client:
    http = httpx2.AsyncClient(headers={"authorization": f"Bearer {token}"}, timeout=30)
    return Client(streamable_http_client(url, http_client=http), mode=mode, **callbacks)


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


@pytest_asyncio.fixture
async def teams(kube: Kube) -> AsyncIterator[tuple[str, str]]:
    """Two teams' namespaces, each with its Webhook to close an issue (the tracker's undo)."""
    async with (
        fresh_namespace(kube, f"team-a-{uuid.uuid4().hex[:6]}") as team_a,
        fresh_namespace(kube, f"team-b-{uuid.uuid4().hex[:6]}") as team_b,
    ):
        yield team_a, team_b


def session_request(token: str, body: dict[str, Any], session: str | None = None) -> tuple[dict[str, str], Any]:
    headers = {"accept": "application/json, text/event-stream", "authorization": f"Bearer {token}"}
    if session is not None:
        headers |= {"mcp-session-id": session, "mcp-protocol-version": "2025-11-25"}
    return headers, body


async def test_two_teams_through_one_gateway_each_with_its_own_sagas_and_neither_reaching_the_other_s(
    cluster: Cluster,
    kube: Kube,
    tracker: Tracker,  # noqa: F811
    hydra: Hydra,
    teams: tuple[str, str],
    tmp_path: Path,
) -> None:
    team_a, team_b = teams
    for team in teams:
        await kube.create(
            "webhooks", team, webhook("tracker.close-issue", url=tracker.url, mcp={"tool": "close_issue"})
        )
    await kube.request("POST", f"/api/v1/namespaces/{team_b}/serviceaccounts", {"metadata": {"name": "agent"}})
    port = free_port()
    resource = f"http://127.0.0.1:{port}/mcp"
    hydra.client("team-a-agent", [resource])
    a_principal = f"{hydra.issuer}#team-a-agent"
    b_principal = f"system:serviceaccount:{team_b}:agent"
    auth = {"resource": resource, "issuers": [{"issuer": hydra.issuer}], "serviceAccounts": True}
    tenancy = {"table": {a_principal: team_a}}  # team B's ServiceAccount: its own namespace
    config = gateway_config(team_a, tracker, auth=auth, tenancy=tenancy)
    gateway = GatewayProcess(cluster.kubeconfig, config, tmp_path, port=port)
    operators = [OperatorProcess(cluster.kubeconfig, team, tmp_path) for team in teams]
    for operator in operators:
        operator.start()
    a_token = hydra.token("team-a-agent", resource)
    b_token = await service_account_token(kube, team_b, "agent", resource)
    try:
        async with agent(gateway.url, a_token, "auto") as a, agent(gateway.url, b_token, "auto") as b:
            a_handle = handle_of(await a.call_tool("create_issue", {"title": "a1"}))
            assert not (await a.call_tool("create_issue", {"title": "a2", HANDLE: a_handle})).is_error
            b_handle = handle_of(await b.call_tool("create_issue", {"title": "b1"}))
            [a_saga] = await kube.list("sagas", team_a)
            [b_saga] = await kube.list("sagas", team_b)
            assert (a_saga["spec"]["principal"], b_saga["spec"]["principal"]) == (a_principal, b_principal)
            # B with A's handle: refused, saying so, and nothing called or changed.
            with pytest.raises(MCPError, match="minted for another client identity"):
                await b.call_tool("create_issue", {"title": "b-in-a", HANDLE: a_handle})
            for own, arguments in [
                ("undolog_status", {}),
                ("undolog_abort", {"reason": "not mine"}),
                ("undolog_rewind", {"to_step": "1", "reason": "not mine"}),
            ]:
                said = await b.call_tool(own, {HANDLE: a_handle, **arguments})
                assert said.is_error, own
                assert "minted for another client identity" in text(said), (own, text(said))
            assert len(tracker.issues.opened) == 3
            assert (await kube.get("sagas", team_a, a_saga["metadata"]["name"]))["spec"].get("outcome") is None
            # Each aborts its own saga: everything of its own is undone, in its own namespace.
            assert not (await a.call_tool("undolog_abort", {HANDLE: a_handle, "reason": "a is done"})).is_error
            assert not (await b.call_tool("undolog_abort", {HANDLE: b_handle, "reason": "b is done"})).is_error
        a_done = await saga_phase(kube, team_a, a_saga["metadata"]["name"], "Compensated")
        b_done = await saga_phase(kube, team_b, b_saga["metadata"]["name"], "Compensated")
        assert sorted(close.number for close in tracker.issues.closes) == [1, 2, 3]
        assert a_done["metadata"]["annotations"]["undolog.io/abort-reason"] == f"a is done (aborted by {a_principal})"
        assert b_principal in b_done["metadata"]["annotations"]["undolog.io/abort-reason"]
        # Who opened each, as people see it: kubectl's wide columns, the field selector, the CLI.
        wide = cluster.kubectl("get", "sagas", "-A", "-o", "wide").stdout
        assert "PRINCIPAL" in wide
        assert a_principal in wide
        assert b_principal in wide
        selected = cluster.kubectl(
            "get", "sagas", "-A", "--field-selector", f"spec.principal={b_principal}", "-o", "name"
        )
        assert selected.stdout.split() == [f"saga.undolog.io/{b_saga['metadata']['name']}"]
        listed = undolog(cluster, "list", "-A", "--principal", a_principal, "-o", "wide")
        assert listed.returncode == 0, listed.stderr
        assert a_saga["metadata"]["name"] in listed.stdout
        assert b_saga["metadata"]["name"] not in listed.stdout
        shown = undolog(cluster, "show", a_saga["metadata"]["name"], "-n", team_a)
        assert f"opened for: {a_principal}" in shown.stdout
    finally:
        gateway.stop()
        for operator in operators:
            operator.stop()


async def test_a_session_answers_only_the_principal_that_opened_it(
    cluster: Cluster,
    kube: Kube,
    namespace: str,
    tracker: Tracker,  # noqa: F811
    hydra: Hydra,
    gateway: Authenticated,
    service_account: str,
) -> None:
    """Team A's session id in team B's hands: its requests and its DELETE are answered as if the
    session did not exist, and A's session goes on."""
    resource = gateway.resource
    a_token = hydra.token(_client(hydra, resource), resource)
    b_token = await service_account_token(kube, namespace, service_account, resource)
    url = gateway.process.url
    async with httpx.AsyncClient(timeout=10) as http:
        opened = await http.post(url, json=raw_request("session")[1], headers=session_request(a_token, {})[0])
        session = opened.headers["mcp-session-id"]
        call = {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {"name": "create_issue", "arguments": {"title": "x"}},
        }
        stolen = await http.post(url, json=call, headers=session_request(b_token, call, session)[0])
        assert stolen.status_code == 404, stolen.text
        ended = await http.delete(url, headers=session_request(b_token, {}, session)[0])
        assert ended.status_code == 404, ended.text
        initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        await http.post(url, json=initialized, headers=session_request(a_token, {}, session)[0])
        own = await http.post(url, json=call, headers=session_request(a_token, call, session)[0])
        assert own.status_code == 200, own.text
    assert [issue["title"] for issue in tracker.issues.opened.values()] == ["x"]


TEAM_B_RULE = "principal.serviceAccount != null && principal.serviceAccount.name == 'agent'"


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_a_policy_denies_one_tool_and_asks_before_another_for_one_team_only(
    cluster: Cluster,
    kube: Kube,
    namespace: str,
    tracker: Tracker,  # noqa: F811
    hydra: Hydra,
    service_account: str,
    tmp_path: Path,
    mode: str,
) -> None:
    port = free_port()
    resource = f"http://127.0.0.1:{port}/mcp"
    auth = {"resource": resource, "issuers": [{"issuer": hydra.issuer}], "serviceAccounts": True}
    policies = [
        {"name": "b-never-labels", "when": f"{TEAM_B_RULE} && tool == 'tracker.label_issue'", "action": "deny"},
        {"name": "b-asks-to-create", "when": f"{TEAM_B_RULE} && tool == 'tracker.create_issue'", "action": "confirm"},
    ]
    config = gateway_config(namespace, tracker, auth=auth, policies=policies, unmapped="pass")
    gateway = GatewayProcess(cluster.kubeconfig, config, tmp_path, port=port)
    a_token = hydra.token(_client(hydra, resource), resource)
    b_token = await service_account_token(kube, namespace, service_account, resource)
    asked: dict[str, list[str]] = {"a": [], "b": []}
    try:
        async with (
            agent(gateway.url, a_token, mode, elicitation_callback=confirming("decline", asked["a"])) as a,
            agent(gateway.url, b_token, mode, elicitation_callback=confirming("decline", asked["b"])) as b,
        ):
            assert "label_issue" not in {tool.name for tool in (await b.list_tools()).tools}
            assert "label_issue" in {tool.name for tool in (await a.list_tools()).tools}
            with pytest.raises(
                MCPError, match=r"tool tracker\.label_issue was not called: denied by policy b-never-labels"
            ):
                await b.call_tool("label_issue", {"number": 1, "label": "b"})
            declined = await b.call_tool("create_issue", {"title": "b asked"})
            assert declined.is_error, text(declined)
            assert asked["b"]
            assert "Policy b-asks-to-create asks you first" in asked["b"][0]
            assert tracker.issues.opened == {}  # nothing of B's reached the tracker
            assert not (await a.call_tool("create_issue", {"title": "a"})).is_error
            assert not (await a.call_tool("label_issue", {"number": 1, "label": "a"})).is_error
        assert asked["a"] == []  # team A is never asked
        assert tracker.issues.opened[1].get("labels") == ["a"]
    finally:
        gateway.stop()


async def test_a_caller_past_its_limits_is_told_which_and_nothing_is_called(
    cluster: Cluster,
    kube: Kube,
    namespace: str,
    tracker: Tracker,  # noqa: F811
    service_account: str,
    tmp_path: Path,
) -> None:
    port = free_port()
    resource = f"http://127.0.0.1:{port}/mcp"
    limits = {"callsPerSecond": 0.2, "burst": 3, "openSagas": 1}  # a token every 5 s: the four calls fit well within
    config = gateway_config(namespace, tracker, auth={"resource": resource, "serviceAccounts": True}, limits=limits)
    gateway = GatewayProcess(cluster.kubeconfig, config, tmp_path, port=port)
    token = await service_account_token(kube, namespace, service_account, resource)
    try:
        async with agent(gateway.url, token, "auto") as called:
            assert not (await called.call_tool("create_issue", {"title": "one"})).is_error
            with pytest.raises(MCPError, match=r"has 1 sagas open in .* \(limits.openSagas 1\): commit or abort one"):
                await called.call_tool("create_issue", {"title": "a second saga"})
            assert (await called.call_tool("list_issues", {})).content
            with pytest.raises(MCPError, match=r"past its 0.2 calls a second \(limits.callsPerSecond, burst 3\)"):
                await called.call_tool("list_issues", {})
        assert [issue["title"] for issue in tracker.issues.opened.values()] == ["one"]
    finally:
        gateway.stop()


TRACKER_AUDIENCE = "http://127.0.0.1:1/the-tracker"  # the tracker's own audience at Hydra


def tls_folder(folder: Path) -> dict[str, str]:
    """An authority, the tracker's serving certificate and the gateway's client certificate: the
    tracker's files written to `folder`, the gateway's Secret returned."""
    authority = certificate_authority("the tracker's authority")
    served, client = serving_certificate(authority, "tracker"), client_certificate(authority, "undolog-gateway")
    folder.mkdir()
    (folder / "tracker.crt").write_bytes(served.certificate_pem)
    (folder / "tracker.key").write_bytes(served.key_pem)
    (folder / "ca.crt").write_bytes(authority.certificate_pem)
    return {
        "tls.crt": client.certificate_pem.decode(),
        "tls.key": client.key_pem.decode(),
        "ca.crt": authority.certificate_pem.decode(),
    }


async def upstream_credentials(
    kind: str, kube: Kube, namespace: str, hydra: Hydra, tmp_path: Path
) -> tuple[Tracker, dict[str, Any]]:
    """A tracker that takes only its own credential, and the gateway's upstream that holds it:
    a fixed token from a Secret, a token Hydra grants the gateway's client (which the tracker
    asks Hydra about: active, and for the tracker's audience), or a client certificate (the
    tracker serves TLS only to a certificate its authority signed)."""
    if kind == "clientCertificate":
        pair = tls_folder(tmp_path / "tracker-tls")
        secret = {"metadata": {"name": "tracker-certificate"}, "stringData": pair}
        await kube.request("POST", f"/api/v1/namespaces/{namespace}/secrets", secret)
        return Tracker(tls=tmp_path / "tracker-tls"), {"clientCertificate": {"name": "tracker-certificate"}}
    if kind == "headersFrom":
        own = "the-tracker-s-own-token"
        secret = {"metadata": {"name": "tracker-credentials"}, "stringData": {"Authorization": f"Bearer {own}"}}
        await kube.request("POST", f"/api/v1/namespaces/{namespace}/secrets", secret)
        return Tracker(token=own), {"headersFrom": {"name": "tracker-credentials"}}
    hydra.client("gateway-to-tracker", [TRACKER_AUDIENCE])
    client = {"client_id": "gateway-to-tracker", "client_secret": hydra.secret("gateway-to-tracker")}
    secret = {"metadata": {"name": "tracker-client"}, "stringData": client}
    await kube.request("POST", f"/api/v1/namespaces/{namespace}/secrets", secret)

    async def introspected(said: str | None) -> bool:
        if not said or not said.startswith("Bearer "):
            return False
        async with httpx.AsyncClient() as http:
            url = f"http://127.0.0.1:{hydra.admin}/admin/oauth2/introspect"
            found = (await http.post(url, data={"token": said.removeprefix("Bearer ")}, timeout=10)).json()
        return found.get("active") is True and TRACKER_AUDIENCE in found.get("aud", [])

    grant = {
        "tokenUrl": f"{hydra.issuer}oauth2/token",
        "secret": {"name": "tracker-client"},
        "audience": TRACKER_AUDIENCE,
    }
    return Tracker(accepts=introspected), {"clientCredentials": grant}


@pytest.mark.parametrize("kind", ["headersFrom", "clientCredentials", "clientCertificate"])
@pytest.mark.usefixtures("operator")
async def test_an_upstream_s_own_credential_is_the_gateway_s_never_the_agent_s_and_the_undo_carries_it_too(
    cluster: Cluster, kube: Kube, namespace: str, hydra: Hydra, service_account: str, tmp_path: Path, kind: str
) -> None:
    """The tracker takes only its own credential, which the gateway holds: the agent's calls
    reach it with that (never the agent's token), and when the agent is gone and its saga runs
    out of time, the operator's undo calls reach it, through the gateway, with it too."""
    guarded, credentials = await upstream_credentials(kind, kube, namespace, hydra, tmp_path)
    if kind == "clientCertificate":  # a client without the gateway's certificate does not get in
        trusting = ssl.create_default_context(cafile=str(tmp_path / "tracker-tls" / "ca.crt"))
        async with httpx.AsyncClient(verify=trusting, timeout=5) as http:
            with pytest.raises(httpx.TransportError):
                await http.post(guarded.url, json={})
    port = free_port()
    resource = f"http://127.0.0.1:{port}/mcp"
    config = {
        **gateway_config(namespace, guarded, auth={"resource": resource, "serviceAccounts": True}),
        "upstreams": {"tracker": {"url": guarded.url, "credentials": credentials}},
        "deadlineSeconds": 3,  # the operator aborts the saga of an agent that went away
    }
    gateway = await serving_operator_calls(cluster.kubeconfig, kube, namespace, tmp_path, config, port=port)
    token = await service_account_token(kube, namespace, service_account, resource)
    try:
        async with agent(gateway.url, token, "auto") as called:
            handle = handle_of(await called.call_tool("create_issue", {"title": "one"}))
            assert not (await called.call_tool("create_issue", {"title": "two", HANDLE: handle})).is_error
        # The agent is gone without a word: past its deadline the operator undoes both, through the gateway.
        [saga] = await kube.list("sagas", namespace)
        await saga_phase(kube, namespace, saga["metadata"]["name"], "Compensated", within=60)
    finally:
        gateway.stop()
        guarded.stop()
    assert [close.number for close in guarded.issues.closes] == [2, 1]
    seen = guarded.issues.authorizations
    print(f"\n{kind}: the tracker saw {len(seen)} requests, bearing {len(set(seen))} distinct credentials")
    assert all(token not in said for said in seen if said)  # never the agent's token
    if kind == "clientCertificate":  # over TLS with the gateway's certificate, no header
        assert set(seen) == {None}
        return
    assert None not in seen
    if kind == "headersFrom":
        assert set(seen) == {"Bearer the-tracker-s-own-token"}
    else:
        granted = {
            jwt.decode(s.removeprefix("Bearer "), options={"verify_signature": False})["client_id"] for s in seen if s
        }
        assert granted == {"gateway-to-tracker"}


def typescript_agent(script: str, url: str, scenario: str, token: str | None) -> subprocess.CompletedProcess[str]:
    """An agent on the official TypeScript SDK (tests/mcp_agent), its requests bearing `token`."""
    node = shutil.which("node")
    assert node, "node is needed for the TypeScript agents (the machine's Node 20)"
    environment = {**os.environ, **({"UNDOLOG_AGENT_TOKEN": token} if token else {})}
    return subprocess.run(
        [node, script, url, scenario], cwd=AGENT, env=environment, capture_output=True, text=True, timeout=120
    )


@pytest.mark.usefixtures("close_issue_webhook", "operator")
async def test_typescript_agents_of_both_sdk_majors_bear_their_tokens_and_get_undo(
    kube: Kube,
    namespace: str,
    tracker: Tracker,  # noqa: F811
    hydra: Hydra,
    gateway: Authenticated,
    service_account: str,
) -> None:
    """The SDK 1.x agent (sessions) with a Hydra JWT, the 2.x agent (stateless) with a
    ServiceAccount token: each undone newest first; the 2.x agent without a token is refused."""
    resource = gateway.resource
    refused = typescript_agent("agent2026.mjs", gateway.process.url, "abort-after-three", None)
    assert refused.returncode != 0
    assert "401" in refused.stderr, refused.stderr[-2000:]
    jwt_token = hydra.token(_client(hydra, resource), resource)
    session = typescript_agent("agent.mjs", gateway.process.url, "fail-third", jwt_token)
    assert session.returncode == 0, session.stderr
    account_token = await service_account_token(kube, namespace, service_account, resource)
    stateless = typescript_agent("agent2026.mjs", gateway.process.url, "abort-after-three", account_token)
    assert stateless.returncode == 0, stateless.stderr
    sagas = await eventually(lambda: kube.list("sagas", namespace), lambda s: len(s) == 2, 10, "two sagas")
    for saga in sagas:
        await saga_phase(kube, namespace, saga["metadata"]["name"], "Compensated")
    principals = sorted(s["spec"]["principal"] for s in sagas)
    assert principals == sorted(
        [
            f"{hydra.issuer}#{jwt.decode(jwt_token, options={'verify_signature': False})['sub']}",
            f"system:serviceaccount:{namespace}:agent",
        ]
    )
    closed = [close.number for close in tracker.issues.closes]
    assert [n for n in closed if n <= 3] == [3, 2, 1]  # each saga newest first (the two were undone at once)
    assert [n for n in closed if n > 3] == [6, 5, 4]


async def test_a_tenant_s_undo_through_the_gateway_finds_its_webhooks_in_the_tenant_s_namespace(
    cluster: Cluster, kube: Kube, hydra: Hydra, teams: tuple[str, str], tmp_path: Path
) -> None:
    """Team B's agent (a ServiceAccount of team-b) on a gateway of team-a's namespace, whose
    upstream needs the gateway's credential: the saga is team-b's, so the operator looks for its
    undo's Webhook there; the gateway keeps it there (with its signing keys) before it opens the
    saga, and the undo reaches the tracker through the gateway."""
    team_a, team_b = teams
    await kube.request("POST", f"/api/v1/namespaces/{team_b}/serviceaccounts", {"metadata": {"name": "agent"}})
    guarded, credentials = await upstream_credentials("headersFrom", kube, team_a, hydra, tmp_path)
    port = free_port()
    resource = f"http://127.0.0.1:{port}/mcp"
    config = {
        **gateway_config(team_a, guarded, auth={"resource": resource, "serviceAccounts": True}),
        "upstreams": {"tracker": {"url": guarded.url, "credentials": credentials}},
    }
    gateway = await serving_operator_calls(cluster.kubeconfig, kube, team_a, tmp_path, config, port=port)
    operator = OperatorProcess(cluster.kubeconfig, team_b, tmp_path)
    operator.start()
    token = await service_account_token(kube, team_b, "agent", resource)
    try:
        async with agent(gateway.url, token, "auto") as called:
            handle = handle_of(await called.call_tool("create_issue", {"title": "b's"}))
            assert not (await called.call_tool("undolog_abort", {HANDLE: handle, "reason": "undo b's"})).is_error
        [saga] = await kube.list("sagas", team_b)
        await saga_phase(kube, team_b, saga["metadata"]["name"], "Compensated")
    finally:
        gateway.stop()
        operator.stop()
        guarded.stop()
    kept = await kube.get("webhooks", team_b, "tracker.close-issue")
    assert kept["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "undolog-gateway"
    assert kept["spec"]["versions"][0]["url"] == f"http://127.0.0.1:{port}/upstreams/tracker/mcp"
    labels, _ = await kube.secret(team_b, "operator-calls")
    assert labels["undolog.io/webhook-headers"] == "true"
    assert [close.number for close in guarded.issues.closes] == [1]
