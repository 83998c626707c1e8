"""The CRDs on a real apiserver: valid objects are accepted, invalid ones refused with a
message that names the field and the fix."""

from __future__ import annotations

import copy
from datetime import datetime, timedelta
from typing import Any

import pytest

from tests.conftest import Cluster
from tests.support.manifests import API, call, saga, step, undo_entry, webhook
from tests.support.owner_policy import owner_policy_off
from undolog.errors import KubeError
from undolog.kube import Kube, Plural

pytestmark = pytest.mark.cluster


@pytest.fixture
async def namespace(namespace: str, cluster: Cluster, kube: Kube) -> str:
    """These entries are written without an owner: the CRD's own rules are under test here, not
    the admission policy (tests/cluster/test_entry_owner_policy.py)."""
    await owner_policy_off(cluster, kube, namespace)
    return namespace


ORDERED = [step("reserve_stock"), step("authorize"), step("capture", "Pivot"), step("confirm", "Retriable")]


async def test_valid_objects_are_accepted_with_defaults(kube: Kube, namespace: str) -> None:
    orchestrated = await kube.create("sagas", namespace, saga("order-1", ORDERED, orgId="acme"))
    assert orchestrated["spec"]["compensationPolicy"] == {
        "onFailure": "Halt",
        "backoff": {"initialMilliseconds": 100, "multiplier": 2.0, "maxMilliseconds": 5000, "maxRetries": 3},
    }
    assert orchestrated["spec"]["steps"][0]["action"]["version"] == "v1"
    external = await kube.create("sagas", namespace, {"apiVersion": API, "kind": "Saga", "metadata": {"name": "agent"}})
    assert external["spec"]["compensationPolicy"]["onFailure"] == "Halt"
    entry = await kube.create("undoentries", namespace, undo_entry("order-1", 1))
    assert entry["metadata"]["name"] == "order-1-1"
    hook = await kube.create("webhooks", namespace, webhook())
    assert hook["spec"]["timeoutSeconds"] == 10
    service_hook = webhook("charge", service={"namespace": "payments", "name": "api", "port": 8443})
    created = await kube.create("webhooks", namespace, service_hook)
    assert created["spec"]["versions"][0]["service"]["path"] == "/"


def with_steps(*steps: dict[str, Any]) -> dict[str, Any]:
    return saga("bad", list(steps))


def too_many_args() -> dict[str, Any]:
    body = with_steps(step("a"))
    body["spec"]["steps"][0]["action"]["args"] = {f"k{i}": i for i in range(33)}
    return body


REFUSED_ON_CREATE: list[tuple[str, Plural, dict[str, Any], list[str]]] = [
    (
        "compensatable after pivot",
        "sagas",
        with_steps(step("a"), step("charge", "Pivot"), step("b")),
        ["spec.steps", 'step "b" (Compensatable) comes after step "charge" (Pivot): order spec.steps as'],
    ),
    (
        "compensatable after retriable",
        "sagas",
        with_steps(step("a"), step("notify", "Retriable"), step("b")),
        ["spec.steps", 'step "b" (Compensatable) comes after step "notify" (Retriable)'],
    ),
    (
        "pivot after retriable",
        "sagas",
        with_steps(step("notify", "Retriable"), step("charge", "Pivot")),
        ["spec.steps", 'step "charge" (Pivot) comes after step "notify" (Retriable)'],
    ),
    (
        "two pivots",
        "sagas",
        with_steps(step("charge", "Pivot"), step("ship", "Pivot")),
        ["spec.steps", 'step "ship" is a second Pivot'],
    ),
    (
        "missing compensation",
        "sagas",
        with_steps(step("a", compensation=False)),
        ["spec.steps[0]", 'step "a" is Compensatable and needs spec.steps[].compensation'],
    ),
    (
        "forbidden compensation",
        "sagas",
        with_steps(step("charge", "Pivot", compensation=True)),
        ["spec.steps[0]", 'step "charge" is Pivot and cannot have a compensation'],
    ),
    (
        "duplicate step names",
        "sagas",
        with_steps(step("a"), step("b"), step("a")),
        ["spec.steps", 'step name "a" is used more than once'],
    ),
    (
        "bad step type",
        "sagas",
        with_steps({**step("a"), "type": "Reversible"}),
        ["spec.steps[0].type", "Unsupported value", '"Reversible"'],
    ),
    ("oversized args", "sagas", too_many_args(), ["spec.steps[0].action.args", "must have at most 32"]),
    (
        "too many steps",
        "sagas",
        with_steps(*(step(f"s{i}") for i in range(51))),
        ["spec.steps", "at most 50"],
    ),
    ("bad step name", "sagas", with_steps(step("Create User")), ["spec.steps[0].name", "should match"]),
    ("bad outcome", "sagas", saga("bad", outcome="Rollback"), ["spec.outcome", "Unsupported value"]),
    ("org id not a label value", "sagas", saga("bad", orgId="acme inc"), ["spec.orgId", "should match"]),
    (
        "deadline past year 9999",
        "sagas",
        saga("bad", activeDeadlineSeconds=10**12),
        ["spec.activeDeadlineSeconds", "should be less than or equal to 3153600000"],
    ),
    (
        "bad backoff multiplier",
        "sagas",
        saga("bad", compensationPolicy={"backoff": {"multiplier": 0.5}}),
        ["spec.compensationPolicy.backoff.multiplier", "should be greater than or equal to 1"],
    ),
    (
        "entry name not saga-position",
        "undoentries",
        {**undo_entry("order-1", 2), "metadata": {"name": "order-1-7"}},
        ["metadata.name must be <spec.saga>-<spec.stackPosition>"],
    ),
    (  # beside order-1-2 it would hold position 2 a second time
        "entry position with a leading zero",
        "undoentries",
        {**undo_entry("order-1", 2), "metadata": {"name": "order-1-02"}},
        ["metadata.name must be <spec.saga>-<spec.stackPosition>"],
    ),
    (
        "entry position zero written twice",
        "undoentries",
        {**undo_entry("order-1", 0), "metadata": {"name": "order-1-00"}},
        ["metadata.name must be <spec.saga>-<spec.stackPosition>"],
    ),
    (
        "entry undoId not a UUID",
        "undoentries",
        undo_entry(undoId="not-a-uuid"),
        ["spec.undoId", "should match"],
    ),
    (
        # sent as the Undolog-Forward-Key header of its compensation, which cannot hold a line break
        "entry effectId with a line break",
        "undoentries",
        undo_entry(effectId="charge-1\nX-Injected: 1"),
        ["spec.effectId", "should match"],
    ),
    (
        "entry without registeredAt",
        "undoentries",
        undo_entry(registeredAt=None),
        ["spec.registeredAt", "Required value"],
    ),
    (
        "webhook with url and service",
        "webhooks",
        webhook(url="http://x/", service={"namespace": "a", "name": "b"}),
        ["spec.versions[0]", 'version "v1" needs exactly one of url or service'],
    ),
    (
        "webhook with ftp url",
        "webhooks",
        webhook(url="ftp://files/"),
        ["spec.versions[0].url", "should match"],
    ),
    (
        "webhook with credentials in its url",
        "webhooks",
        webhook(url="https://billing:s3cret@payments.example/refund"),
        ["spec.versions[0]", 'version "v1": url must not carry credentials (user:password@)'],
    ),
    (
        "webhook without versions",
        "webhooks",
        {**webhook(), "spec": {"versions": []}},
        ["spec.versions", "at least 1"],
    ),
]


@pytest.mark.parametrize(
    ("plural", "body", "expected"),
    [case[1:] for case in REFUSED_ON_CREATE],
    ids=[case[0] for case in REFUSED_ON_CREATE],
)
async def test_invalid_manifest_is_refused_naming_the_field(
    kube: Kube, namespace: str, plural: Plural, body: dict[str, Any], expected: list[str]
) -> None:
    if body["spec"].get("registeredAt", "") is None:
        body = copy.deepcopy(body)
        del body["spec"]["registeredAt"]
    with pytest.raises(KubeError) as refused:
        await kube.create(plural, namespace, body)
    assert refused.value.status == 422
    message = refused.value.message
    for fragment in expected:
        assert fragment in message, message


async def refused_update(kube: Kube, call: Any) -> str:
    with pytest.raises(KubeError) as refused:
        await call
    assert refused.value.status == 422
    return refused.value.message


async def test_undo_entry_spec_is_immutable(kube: Kube, namespace: str) -> None:
    await kube.create("undoentries", namespace, undo_entry("order-1", 1))
    message = await refused_update(
        kube, kube.patch("undoentries", namespace, "order-1-1", {"spec": {"compensation": call("refund")}})
    )
    assert "spec is immutable once the UndoEntry is created" in message


async def test_undo_entry_is_one_per_saga_and_position(kube: Kube, namespace: str) -> None:
    await kube.create("undoentries", namespace, undo_entry("order-1", 3))
    with pytest.raises(KubeError) as refused:
        await kube.create("undoentries", namespace, undo_entry("order-1", 3))
    assert refused.value.status == 409  # AlreadyExists


async def test_executed_at_must_follow_registered_at(kube: Kube, namespace: str) -> None:
    entry = await kube.create("undoentries", namespace, undo_entry("order-1", 1))
    registered = datetime.fromisoformat(entry["spec"]["registeredAt"])
    before = (registered - timedelta(seconds=1)).isoformat().replace("+00:00", "Z")
    message = await refused_update(
        kube, kube.patch_status("undoentries", namespace, "order-1-1", {"status": {"executedAt": before}})
    )
    assert "status.executedAt must come after spec.registeredAt: register before execute" in message
    after = (registered + timedelta(milliseconds=1)).isoformat().replace("+00:00", "Z")
    patched = await kube.patch_status("undoentries", namespace, "order-1-1", {"status": {"executedAt": after}})
    assert patched["status"]["effect"] == "Pending"  # defaults fill the rest of status


async def test_saga_steps_and_outcome_cannot_change(kube: Kube, namespace: str) -> None:
    await kube.create("sagas", namespace, saga("order-1", ORDERED))
    message = await refused_update(
        kube, kube.patch("sagas", namespace, "order-1", {"spec": {"steps": [step("other")]}})
    )
    assert "spec.steps is immutable" in message, message
    await kube.patch("sagas", namespace, "order-1", {"spec": {"outcome": "Abort"}})
    message = await refused_update(kube, kube.patch("sagas", namespace, "order-1", {"spec": {"outcome": "Commit"}}))
    assert "spec.outcome cannot be changed" in message, message


def test_kubectl_prints_columns_and_category(cluster: Cluster, namespace: str, kube: Kube) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", stdin=yaml_of(saga("order-1", ORDERED), webhook()))
    cluster.kubectl("apply", "-n", namespace, "-f", "-", stdin=yaml_of(undo_entry("order-1", 1)))
    header = cluster.kubectl("get", "sagas", "-n", namespace).stdout.splitlines()[0].split()
    assert header == ["NAME", "PHASE", "STEPS", "UNDONE", "REASON", "AGE"]
    undo_header = cluster.kubectl("get", "undo", "-n", namespace).stdout.splitlines()[0].split()
    assert undo_header == ["NAME", "SAGA", "POSITION", "STEP", "EFFECT", "STATE", "RETRIES", "AGE"]
    everything = cluster.kubectl("get", "undolog", "-n", namespace, "-o", "name").stdout.split()
    assert sorted(everything) == [
        "saga.undolog.io/order-1",
        "undoentry.undolog.io/order-1-1",
        "webhook.undolog.io/create-user",
    ]
    explained = cluster.kubectl("explain", "saga.spec.steps").stdout
    assert "Compensatable: undone on failure" in explained
    assert "compensation" in explained
    assert "action" in explained
    by_saga = cluster.kubectl("get", "undo", "-n", namespace, "--field-selector", "spec.saga=order-1", "-o", "name")
    assert by_saga.stdout.split() == ["undoentry.undolog.io/order-1-1"]


def yaml_of(*documents: dict[str, Any]) -> str:
    import yaml

    return yaml.safe_dump_all(documents)
