"""UndoLog's own API client against a real apiserver: credentials kubectl users have (exec
plugins, rotating token files, impersonation), and the apiserver's refusals mapped by kind."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import Cluster
from tests.support.identities import create_service_account, service_account_token
from undolog import errors
from undolog.kube import Kube

pytestmark = pytest.mark.cluster


def with_user(cluster: Cluster, target: Path, user: dict[str, object]) -> Path:
    """The test cluster's kubeconfig with another user."""
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    config["users"] = [{"name": "other", "user": user}]
    for named in config["contexts"]:
        named["context"]["user"] = "other"
    target.write_text(yaml.safe_dump(config))
    return target


async def test_an_exec_plugin_kubeconfig_acts_as_whoever_the_plugin_names(
    kube: Kube, namespace: str, cluster: Cluster, tmp_path: Path
) -> None:
    await create_service_account(kube, namespace, "robot")
    (tmp_path / "token").write_text(await service_account_token(kube, namespace, "robot"))
    script = tmp_path / "plugin.py"
    script.write_text(
        "import json, sys\n"
        f"token = open({str(tmp_path / 'token')!r}).read()\n"
        'print(json.dumps({"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",'
        ' "status": {"token": token}}))\n'
    )
    plugin = {"apiVersion": "client.authentication.k8s.io/v1", "command": sys.executable, "args": [str(script)]}
    async with await Kube.connect(str(with_user(cluster, tmp_path / "config", {"exec": plugin}))) as robot:
        assert await robot.whoami() == f"system:serviceaccount:{namespace}:robot"
        with pytest.raises(
            errors.Forbidden, match=re.escape(f'User "system:serviceaccount:{namespace}:robot" cannot list')
        ):
            await robot.list("sagas", namespace)


async def test_a_token_file_rotated_under_a_refusal_is_read_again(
    kube: Kube, namespace: str, cluster: Cluster, tmp_path: Path
) -> None:
    """A projected token rotates; a request refused with 401 reads the file again and is retried
    once, so the caller sees no refusal."""
    await create_service_account(kube, namespace, "robot")
    token = tmp_path / "token"
    token.write_text("expired-token")
    async with await Kube.connect(str(with_user(cluster, tmp_path / "config", {"tokenFile": str(token)}))) as robot:
        token.write_text(await service_account_token(kube, namespace, "robot"))
        assert await robot.whoami() == f"system:serviceaccount:{namespace}:robot"


async def test_impersonation_is_checked_by_the_api(kube: Kube, cluster: Cluster) -> None:
    async with await Kube.connect(str(cluster.kubeconfig), as_user="alice", as_groups=["devs", "ops"]) as alice:
        assert await alice.whoami() == "alice"
        with pytest.raises(errors.Forbidden, match='User "alice" cannot list'):
            await alice.list("sagas", "default")


async def test_refusals_are_mapped_by_kind_with_the_apiservers_message(kube: Kube, namespace: str) -> None:
    with pytest.raises(errors.NotFound, match=re.escape('sagas.undolog.io "absent" not found')):
        await kube.get("sagas", namespace, "absent")
    with pytest.raises(errors.NotFound) as missing:  # the driver tells a deleted entry from its saga by these
        await kube.patch_status("undoentries", namespace, "absent-1", {"status": {"state": "Pending"}})
    assert missing.value.details is not None
    assert (missing.value.details.kind, missing.value.details.name) == ("undoentries", "absent-1")
    _, version = await kube.list_versioned("sagas", namespace)
    with pytest.raises(errors.Gone):  # a revision older than the watch cache: a 410 inside the stream
        async for _ in kube.watch("sagas", namespace, "1"):
            pass
    assert int(version) > 1


async def test_impersonating_a_uid_and_extras_reaches_the_api(cluster: Cluster, tmp_path: Path) -> None:
    """as-uid and as-user-extra of a kubeconfig's user are sent (they were ignored)."""
    user = {"as": "alice", "as-uid": "uid-1234", "as-user-extra": {"reason": ["on call", "incident 7"]}}
    merged = yaml.safe_load(cluster.kubeconfig.read_text())
    for named in merged["users"]:
        named["user"].update(user)
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump(merged))
    async with await Kube.connect(str(path)) as alice:
        review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
        seen = (await alice.request("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", review))["status"]
    assert seen["userInfo"]["username"] == "alice"
    assert seen["userInfo"]["uid"] == "uid-1234"
    assert seen["userInfo"]["extra"] == {"reason": ["on call", "incident 7"]}
