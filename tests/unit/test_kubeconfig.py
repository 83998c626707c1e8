"""Reading a kubeconfig as kubectl does, and refusing what UndoLog cannot honour by name."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from undolog import errors
from undolog.kube import Kube, kubeconfig
from undolog.kube.kopf_runtime import connection_info
from undolog.kube.kubeconfig import TokenSource, credentials, default_namespace


def write(path: Path, clusters: list[Any], users: list[Any], contexts: list[Any], current: str | None) -> Path:
    document = {"apiVersion": "v1", "kind": "Config", "clusters": clusters, "users": users, "contexts": contexts}
    if current:
        document["current-context"] = current
    path.write_text(yaml.safe_dump(document))
    return path


def cluster(name: str, server: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "cluster": {"server": server, **fields}}


def user(name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "user": fields}


def context(name: str, cluster_name: str, user_name: str, namespace: str | None = None) -> dict[str, Any]:
    body = {"cluster": cluster_name, "user": user_name}
    if namespace:
        body["namespace"] = namespace
    return {"name": name, "context": body}


@pytest.fixture(autouse=True)
def outside_a_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBECONFIG", raising=False)


def test_kubeconfig_files_merge_first_wins_and_paths_are_relative_to_their_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = write(
        tmp_path / "a" / "config",
        [cluster("prod", "https://127.0.0.1:6443/", **{"certificate-authority": "ca.crt"})],
        [user("me", **{"client-certificate": "me.crt", "client-key": "me.key"})],
        [context("prod", "prod", "me", "shop")],
        "prod",
    )
    second = write(
        tmp_path / "b" / "config",
        [cluster("prod", "https://127.0.0.2:6443"), cluster("dev", "https://127.0.0.3:6443")],
        [user("robot", token="t0ken")],
        [context("prod", "dev", "robot"), context("dev", "dev", "robot")],
        "dev",
    )
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join([str(first), str(second)]))
    found = credentials()
    assert found.server == "https://127.0.0.1:6443"  # the first file's prod; no trailing slash
    assert found.ca_file == str(tmp_path / "a" / "ca.crt")
    assert (found.certificate_file, found.key_file) == (str(tmp_path / "a" / "me.crt"), str(tmp_path / "a" / "me.key"))
    assert found.namespace == "shop" == default_namespace()
    dev = credentials(context="dev")  # a context only the second file defines
    assert (dev.server, dev.token, dev.namespace) == ("https://127.0.0.3:6443", "t0ken", "default")


def test_data_fields_are_decoded_and_impersonation_from_flags_replaces_the_files(tmp_path: Path) -> None:
    pem = b"-----BEGIN CERTIFICATE-----\n"
    path = write(
        tmp_path / "config",
        [cluster("c", "https://127.0.0.1:6443", **{"certificate-authority-data": base64.b64encode(pem).decode()})],
        [user("u", token="t", **{"as": "alice", "as-groups": ["devs"]})],
        [context("c", "c", "u")],
        "c",
    )
    found = credentials(str(path))
    assert found.ca_data == pem
    assert (found.as_user, found.as_groups) == ("alice", ("devs",))
    flagged = credentials(str(path), as_user="bob", as_groups=["ops", "oncall"])
    assert (flagged.as_user, flagged.as_groups) == ("bob", ("ops", "oncall"))


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"auth-provider": {"name": "oidc"}}, "uses auth-provider"),
        ({"username": "admin", "password": "x"}, "uses username"),
    ],
)
def test_what_undolog_cannot_honour_is_refused_by_file_user_and_field(
    tmp_path: Path, fields: dict[str, Any], named: str
) -> None:
    path = write(
        tmp_path / "config",
        [cluster("c", "https://127.0.0.1:6443")],
        [user("u", **fields)],
        [context("c", "c", "u")],
        "c",
    )
    with pytest.raises(errors.KubeconfigInvalid) as refused:
        credentials(str(path))
    assert f"the kubeconfig {path}, user 'u' {named}" in refused.value.message


def test_a_missing_context_names_the_ones_there_are(tmp_path: Path) -> None:
    path = write(
        tmp_path / "config", [cluster("c", "https://127.0.0.1:6443")], [user("u")], [context("c", "c", "u")], None
    )
    with pytest.raises(errors.KubeconfigInvalid, match="sets no current-context: pass --context"):
        credentials(str(path))
    with pytest.raises(errors.KubeconfigInvalid, match=r"has no context 'other' \(it has: c\)"):
        credentials(str(path), "other")
    assert default_namespace(str(tmp_path / "absent")) == "default"
    with pytest.raises(errors.KubeconfigInvalid, match="no kubeconfig found at"):
        credentials(str(tmp_path / "absent"))


def plugin_kubeconfig(tmp_path: Path, expires_in: float | None, exit_code: int = 0) -> Path:
    """A kubeconfig whose user is an exec plugin (a real script) that counts its runs."""
    script = tmp_path / "plugin.py"
    expiry = (
        "None"
        if expires_in is None
        else f"(datetime.now(UTC) + timedelta(seconds={expires_in})).strftime('%Y-%m-%dT%H:%M:%SZ')"
    )
    script.write_text(
        f"""
import json, os, sys
from datetime import UTC, datetime, timedelta
runs = os.path.join({str(tmp_path)!r}, "runs")
count = (int(open(runs).read()) if os.path.exists(runs) else 0) + 1
open(runs, "w").write(str(count))
info = json.loads(os.environ["KUBERNETES_EXEC_INFO"])
if {exit_code}:
    print("login refused for " + os.environ["TEAM"], file=sys.stderr)
    sys.exit({exit_code})
status = {{"token": f"token-{{count}}-{{os.environ['TEAM']}}-{{info['spec']['interactive']}}"}}
expiry = {expiry}
if expiry:
    status["expirationTimestamp"] = expiry
print(json.dumps({{"apiVersion": info["apiVersion"], "kind": "ExecCredential", "status": status}}))
"""
    )
    plugin = {
        "apiVersion": "client.authentication.k8s.io/v1",
        "command": sys.executable,
        "args": [str(script)],
        "env": [{"name": "TEAM", "value": "payments"}],
    }
    return write(
        tmp_path / "config",
        [cluster("c", "https://127.0.0.1:6443")],
        [user("u", exec=plugin)],
        [context("c", "c", "u")],
        "c",
    )


def runs(tmp_path: Path) -> int:
    return int((tmp_path / "runs").read_text())


async def test_an_exec_plugin_runs_once_until_its_credential_expires(tmp_path: Path) -> None:
    lasting = TokenSource(credentials(str(plugin_kubeconfig(tmp_path, expires_in=3600))))
    assert await lasting.token() == "token-1-payments-False"  # its env, and told it cannot prompt
    assert await lasting.token() == "token-1-payments-False"
    assert runs(tmp_path) == 1
    lasting.forget()  # the API answered 401: it is run again
    assert await lasting.token() == "token-2-payments-False"

    expiring = TokenSource(credentials(str(plugin_kubeconfig(tmp_path, expires_in=5))))  # within the margin
    first, second = await expiring.token(), await expiring.token()
    assert (first, second) == ("token-3-payments-False", "token-4-payments-False")


async def test_requests_that_find_the_credential_expired_together_run_the_plugin_once(tmp_path: Path) -> None:
    """The operator, the CLI or the dashboard sends many requests at once; when the exec
    credential expires (or the API answers them all 401), each used to run the plugin itself:
    a plugin that takes a second (a cloud's login) ran once per request, a few at a time in
    asyncio's threads, and every request waited for the queue."""
    source = TokenSource(credentials(str(plugin_kubeconfig(tmp_path, expires_in=3600))))
    assert set(await asyncio.gather(*(source.token() for _ in range(20)))) == {"token-1-payments-False"}
    assert runs(tmp_path) == 1
    refused = source.generation
    for _ in range(20):  # twenty requests refused with the same credential
        source.forget(refused)
    assert set(await asyncio.gather(*(source.token() for _ in range(20)))) == {"token-2-payments-False"}
    source.forget(refused)  # a refusal of the credential that was replaced already: nothing to do
    assert await source.token() == "token-2-payments-False"
    assert runs(tmp_path) == 2


async def test_a_plugin_that_fails_fails_every_request_waiting_on_it_with_one_run(tmp_path: Path) -> None:
    failing = TokenSource(credentials(str(plugin_kubeconfig(tmp_path, expires_in=None, exit_code=3))))
    outcomes = await asyncio.gather(*(failing.token() for _ in range(10)), return_exceptions=True)
    assert all(isinstance(o, errors.KubeconfigInvalid) for o in outcomes)
    assert runs(tmp_path) == 1
    with pytest.raises(errors.KubeconfigInvalid):  # a request after it tries again
        await failing.token()
    assert runs(tmp_path) == 2


async def test_an_exec_plugin_that_fails_says_how(tmp_path: Path) -> None:
    failing = TokenSource(credentials(str(plugin_kubeconfig(tmp_path, expires_in=None, exit_code=3))))
    with pytest.raises(errors.KubeconfigInvalid, match="exited with 3: login refused for payments"):
        await failing.token()


async def test_a_token_file_is_read_again_after_a_refusal(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("old\n")
    path = write(
        tmp_path / "config",
        [cluster("c", "https://127.0.0.1:6443")],
        [user("u", tokenFile="token")],
        [context("c", "c", "u")],
        "c",
    )
    source = TokenSource(credentials(str(path)))
    assert await source.token() == "old"
    token.write_text("rotated\n")
    assert await source.token() == "old"  # read again within a minute, or on a 401:
    source.forget()
    assert await source.token() == "rotated"


def test_the_service_account_in_a_pod(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    monkeypatch.setattr(kubeconfig, "SERVICE_ACCOUNT", tmp_path)
    (tmp_path / "namespace").write_text("undolog-system\n")
    found = credentials()
    assert found.server == "https://[::1]:443"
    assert (found.token_file, found.namespace) == (str(tmp_path / "token"), "undolog-system")
    assert default_namespace() == "undolog-system"


async def test_kopf_logs_in_with_the_same_credentials_issued_again(tmp_path: Path) -> None:
    """kopf asks at start and when its credentials expire or are refused: each time anew."""
    kube = Kube(credentials(str(plugin_kubeconfig(tmp_path, expires_in=3600))))
    first = await connection_info(kube)
    assert (first.server, first.token) == ("https://127.0.0.1:6443", "token-1-payments-False")
    assert first.expiration is not None
    assert first.expiration.timestamp() > time.time() + 3000
    assert (await connection_info(kube)).token == "token-2-payments-False"


def spy_plugin(tmp_path: Path, **exec_fields: Any) -> Path:
    """A plugin that prompts on stderr, writes what it was told to `told.json`, and gives a token."""
    script = tmp_path / "spy.py"
    script.write_text(
        "import json, os, sys\n"
        "print('To sign in, open https://login.example/device and enter ABCD-EFGH', file=sys.stderr, flush=True)\n"
        f"open({str(tmp_path / 'told.json')!r}, 'w').write(os.environ['KUBERNETES_EXEC_INFO'])\n"
        'print(json.dumps({"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",'
        ' "status": {"token": "t"}}))\n'
    )
    plugin = {"apiVersion": "client.authentication.k8s.io/v1", "command": sys.executable, "args": [str(script)]}
    ca = base64.b64encode(b"-----BEGIN CERTIFICATE-----\n...").decode()
    extension = {"name": "client.authentication.k8s.io/exec", "extension": {"audience": "undolog"}}
    return write(
        tmp_path / "config",
        [cluster("c", "https://127.0.0.1:6443", **{"certificate-authority-data": ca, "extensions": [extension]})],
        [user("u", exec={**plugin, **exec_fields})],
        [context("c", "c", "u")],
        "c",
    )


async def test_an_exec_plugin_s_prompt_reaches_the_terminal_and_it_is_told_the_cluster_when_it_asks(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    assert await TokenSource(credentials(str(spy_plugin(tmp_path, provideClusterInfo=True)))).token() == "t"
    assert "enter ABCD-EFGH" in capfd.readouterr().err  # a device-code login is seen, not swallowed
    told = json.loads((tmp_path / "told.json").read_text())["spec"]
    assert told["interactive"] is False  # the tests' stdin is no terminal
    assert told["cluster"]["server"] == "https://127.0.0.1:6443"
    assert told["cluster"]["config"] == {"audience": "undolog"}
    assert base64.b64decode(told["cluster"]["certificate-authority-data"]).startswith(b"-----BEGIN")
    await TokenSource(credentials(str(spy_plugin(tmp_path)))).token()
    assert "cluster" not in json.loads((tmp_path / "told.json").read_text())["spec"]  # not asked: not told


async def test_an_exec_plugin_that_needs_a_terminal_without_one_is_refused_naming_why(tmp_path: Path) -> None:
    with pytest.raises(errors.KubeconfigInvalid, match=r"needs a terminal \(interactiveMode: Always\)"):
        await TokenSource(credentials(str(spy_plugin(tmp_path, interactiveMode="Always")))).token()
    with pytest.raises(errors.KubeconfigInvalid, match=r"exec\.interactiveMode is 'Sometimes'"):
        credentials(str(spy_plugin(tmp_path, interactiveMode="Sometimes")))


def test_impersonation_of_a_uid_and_extras_is_read(tmp_path: Path) -> None:
    path = write(
        tmp_path / "config",
        [cluster("c", "https://127.0.0.1:6443")],
        [user("u", **{"as": "alice", "as-uid": "1234", "as-user-extra": {"reason": ["on call", "incident 7"]}})],
        [context("c", "c", "u")],
        "c",
    )
    found = credentials(str(path))
    assert (found.as_user, found.as_uid) == ("alice", "1234")
    assert found.as_extra == (("reason", "on call"), ("reason", "incident 7"))
