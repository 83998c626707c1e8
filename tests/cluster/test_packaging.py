"""Production packaging: the Helm chart on a real apiserver, its RBAC proven by running the
operator as the chart's ServiceAccount, tenancy, HA hand-over and metrics."""

from __future__ import annotations

import asyncio
import base64
import re
import shutil
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import promql_parser
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.cluster.test_compensation import abort, external_saga, register
from tests.conftest import BIN, REPO, Cluster, install_crds
from tests.support.identities import lease_holder, service_account_kubeconfig
from tests.support.manifests import call, saga, webhook
from tests.support.namespaces import fresh_namespace
from tests.support.operator_process import OperatorProcess
from tests.support.participants import Participant, Reply
from tests.support.waiting import eventually, saga_phase
from undolog.gateway.run import load
from undolog.kube import Kube

pytestmark = pytest.mark.cluster
CHART = REPO / "charts" / "undolog"


def helm(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "helm"), f"--kubeconfig={cluster.kubeconfig}", *args],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def rendered(*sets: str) -> list[dict[str, Any]]:
    args = [str(BIN / "helm"), "template", "undolog", str(CHART), "--kube-version", "1.37.2", "-n", "undolog-system"]
    for value in sets:
        args += ["--set", value]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def test_chart_rbac_is_least_privilege_without_wildcards() -> None:
    for documents in (rendered(), rendered("watchNamespaces={team-a,team-b}")):
        roles = [d for d in documents if d["kind"] in ("Role", "ClusterRole")]
        bound = {
            binding["roleRef"]["name"]
            for binding in documents
            if binding["kind"] in ("RoleBinding", "ClusterRoleBinding")
            and any(subject["kind"] == "ServiceAccount" for subject in binding["subjects"])
        }
        assert bound
        assert bound <= {role["metadata"]["name"] for role in roles}
        for role in roles:
            for rule in role["rules"]:
                for field in ("apiGroups", "resources", "verbs"):
                    assert "*" not in rule[field], (role["metadata"]["name"], rule)
                if role["metadata"]["name"] in bound:  # the operator's own: never escalates, deletes only sagas
                    assert not {"deletecollection", "escalate", "bind", "impersonate"} & set(rule["verbs"])
                    if "delete" in rule["verbs"]:  # retention: finished sagas, their entries by garbage collection
                        assert rule["resources"] == ["sagas"], rule
                if "secrets" in rule["resources"]:
                    assert rule["verbs"] == ["get"]  # never list or watch Secrets
        # People's roles (aggregated into view/edit): reading is read-only; nobody but the operator writes status.
        people = {role["metadata"]["name"]: role for role in roles if role["metadata"]["name"] not in bound}
        assert {rule_verb for rule in people["undolog-view"]["rules"] for rule_verb in rule["verbs"]} == {
            "get",
            "list",
            "watch",
        }
        for role in people.values():
            assert not any(
                resource.endswith("sagas/status") for rule in role["rules"] for resource in rule["resources"]
            )
    scoped = rendered("watchNamespaces={team-a,team-b}")
    assert sorted(
        d["metadata"]["namespace"] for d in scoped if d["kind"] == "Role" and "leader" not in d["metadata"]["name"]
    ) == [
        "team-a",
        "team-b",
    ]
    assert not [d for d in scoped if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "undolog"]
    deployment = next(d for d in rendered() if d["kind"] == "Deployment" and d["metadata"]["name"] == "undolog")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert "--lease-seconds=15" in container["args"]  # every replica stands for the Lease
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"


async def install(cluster: Cluster, kube: Kube, watched: str) -> tuple[str, str]:
    """helm install into a fresh release namespace; returns (release namespace, service account)."""
    release_namespace = f"undolog-{uuid.uuid4().hex[:6]}"
    installed = await asyncio.to_thread(
        helm,
        cluster,
        "install",
        "undolog",
        str(CHART),
        "--namespace",
        release_namespace,
        "--create-namespace",
        "--take-ownership",  # the CRDs the test session applied become the release's
        "--set",
        f"watchNamespaces={{{watched}}}",
        "--wait=false",
    )
    assert installed.returncode == 0, installed.stderr
    assert "undolog retry <name> -n <namespace>" in installed.stdout  # NOTES.txt: the way out of Halted
    return release_namespace, "undolog"


async def test_chart_installs_and_the_operator_works_with_only_its_rbac(
    kube: Kube, namespace: str, participant: Participant, cluster: Cluster, tmp_path: Path
) -> None:
    release_namespace, account = await install(cluster, kube, namespace)
    deployment = await kube.request("GET", f"/apis/apps/v1/namespaces/{release_namespace}/deployments/undolog")
    assert deployment["spec"]["replicas"] == 2
    identity = await service_account_kubeconfig(
        kube, cluster.kubeconfig, release_namespace, account, tmp_path / "sa.kubeconfig", create=False
    )
    # The operator as a process, authenticated as the chart's ServiceAccount: any permission the
    # chart lacks makes these sagas stall and the test fail.
    operator = OperatorProcess(identity, namespace, tmp_path, lease_namespace=release_namespace)
    operator.start()
    try:
        secret = {
            "metadata": {"name": "auth", "labels": {"undolog.io/webhook-headers": "true"}},
            "stringData": {"Authorization": "Bearer t"},
        }
        await kube.request("POST", f"/api/v1/namespaces/{namespace}/secrets", secret)
        participant.script("/refund", Reply(503))
        await register(kube, namespace, participant, "release")
        hook = webhook("refund", url=participant.url("/refund"))
        hook["spec"]["headersFrom"] = {"secretRef": {"name": "auth"}}
        await kube.create("webhooks", namespace, hook)
        await external_saga(kube, namespace, "ext", [call("release"), call("refund")])
        await abort(kube, namespace, "ext")
        await saga_phase(kube, namespace, "ext", "Compensated")
        assert participant.received("/refund")[-1].headers["authorization"] == "Bearer t"

        steps = [
            {"name": "one", "action": {"function": "release"}, "compensation": {"function": "refund"}},
            {"name": "two", "action": {"function": "release"}, "compensation": {"function": "refund"}},
        ]
        await kube.create("sagas", namespace, saga("orch", steps))
        await saga_phase(kube, namespace, "orch", "Completed")
        events = await kube.request("GET", f"/api/v1/namespaces/{namespace}/events")
        # RBAC lets it post them (the orchestrated saga, quick, posts none: it was never written Active)
        assert {"Failed", "CompensationRetry"} <= {e["reason"] for e in events["items"]}
        assert "forbidden" not in operator.log().lower()
    finally:
        operator.stop()
        await asyncio.to_thread(helm, cluster, "uninstall", "undolog", "--namespace", release_namespace)
        # The release took over the session's admission policies and uninstalling deleted them:
        # the tests after this one find them as the session installed them.
        await asyncio.to_thread(install_crds, cluster)
    # crds.keep: the ledger stays
    kept = await kube.request("GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/sagas.undolog.io")
    assert kept["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


async def test_a_saga_cannot_call_a_webhook_of_another_namespace(
    kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess
) -> None:
    async with fresh_namespace(kube, f"{namespace}-other") as other:
        await kube.create("webhooks", other, webhook("refund", url=participant.url("/refund")))
        await external_saga(kube, namespace, "tenant", [call("refund")])
        await abort(kube, namespace, "tenant")
        halted = await saga_phase(kube, namespace, "tenant", "Halted")
        assert halted["status"]["reason"] == "FunctionNotFound"
        assert f"no Webhook 'refund' in namespace {namespace}" in halted["status"]["message"]
        assert participant.received() == []


def scrape(operator: OperatorProcess) -> str:
    return httpx.get(f"http://127.0.0.1:{operator.metrics_port}/metrics", timeout=5).text


def sample(text: str, name: str, **labels: str) -> float | None:
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.split(" ")[0]))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


async def test_metrics_are_served_with_prometheus_names(
    kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess
) -> None:
    participant.script("/refund", Reply(503), Reply(400, {"error": "no"}))
    await register(kube, namespace, participant, "refund", "work")
    await external_saga(kube, namespace, "m", [call("work"), call("refund")])
    await abort(kube, namespace, "m")
    await saga_phase(kube, namespace, "m", "Halted")
    steps = [{"name": "one", "action": {"function": "work"}, "compensation": {"function": "work"}}]
    await kube.create("sagas", namespace, saga("f", steps))
    await saga_phase(kube, namespace, "f", "Completed")
    text = await eventually(
        lambda: asyncio.to_thread(scrape, operator),
        lambda t: sample(t, "undolog_sagas", phase="Completed") == 1.0,
        10,
        "metrics",
    )
    assert sample(text, "undolog_compensation_attempts_total", function="refund", outcome="transient") == 1.0
    assert sample(text, "undolog_compensation_attempts_total", function="refund", outcome="permanent") == 1.0
    assert sample(text, "undolog_halted_sagas") == 1.0
    assert sample(text, "undolog_sagas", phase="Halted") == 1.0
    assert sample(text, "undolog_compensation_call_duration_seconds_count", function="refund") == 2.0
    assert sample(text, "undolog_compensation_duration_seconds_count", function="refund") == 2.0  # deprecated name
    assert sample(text, "undolog_forward_call_duration_seconds_count", function="work") == 1.0
    assert sample(text, "undolog_forward_attempts_total", function="work", outcome="succeeded") == 1.0
    assert sample(text, "undolog_saga_transitions_total", phase="Halted", reason="CompensationFailed") == 1.0
    assert "# TYPE undolog_compensation_call_duration_seconds histogram" in text
    assert sample(text, "undolog_leader") == 1.0
    assert "_created" not in text
    for expression in shipped_queries():
        asks_only_for_what_is_exposed(expression, text)


def shipped_queries() -> list[str]:
    """The PrometheusRule's expressions and the Grafana dashboard's queries, as the chart renders them."""
    documents = rendered(
        "metrics.prometheusRule.enabled=true",
        "metrics.grafanaDashboard.enabled=true",
        "metrics.serviceMonitor.enabled=true",
    )
    rule = next(d for d in documents if d["kind"] == "PrometheusRule")
    queries = [r["expr"] for group in rule["spec"]["groups"] for r in group["rules"]]
    board = next(d for d in documents if d["kind"] == "ConfigMap" and "grafana_dashboard" in d["metadata"]["labels"])
    dashboard = yaml.safe_load(next(iter(board["data"].values())))
    queries += [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    queries += [
        v["query"].removeprefix("label_values(").removesuffix(", namespace)")
        for v in dashboard["templating"]["list"]
        if v["type"] == "query"
    ]
    assert len(queries) >= 12
    return [q.replace("$namespace", ".*") for q in queries]


def asks_only_for_what_is_exposed(expression: str, scraped: str) -> None:
    """Every series an expression selects exists in a real scrape, with every label it matches or
    groups by (and every exact label value it asks for), so no alert is silently never firing."""
    labels: dict[str, list[dict[str, str]]] = {}
    for family in text_string_to_metric_families(scraped):
        for s in family.samples:
            labels.setdefault(s.name, []).append(s.labels)
    problems: list[str] = []

    def check(node: object, grouped_by: list[str]) -> None:
        if not isinstance(node, promql_parser.VectorSelector):
            return
        series = labels.get(node.name or "")
        if not series:
            problems.append(f"{node.name} is not exposed")
            return
        names = set().union(*series)
        for matcher in node.matchers.matchers:
            if matcher.name not in names:
                problems.append(f"{node.name} has no label {matcher.name}")
            elif matcher.op == promql_parser.MatchOp.Equal and matcher.value not in {
                s.get(matcher.name) for s in series
            }:
                problems.append(f"{node.name} never has {matcher.name}={matcher.value!r}")
        problems.extend(f"{node.name} has no label {label} to group by" for label in grouped_by if label not in names)

    def visit(node: object) -> bool:
        by = promql_parser.AggModifierType.By
        if isinstance(node, promql_parser.AggregateExpr) and node.modifier is not None and node.modifier.type == by:
            grouped_by = list(node.modifier.labels)
            promql_parser.walk(node.expr, lambda inner: check(inner, grouped_by))
        check(node, [])
        return True

    promql_parser.walk(promql_parser.parse(expression), visit)  # parse: a syntax error fails here
    assert not problems, (expression, problems)


def operator_lease_holder(kube: Kube, namespace: str) -> Any:
    async def read() -> str:
        return await lease_holder(kube, namespace, "undolog-operator")

    return read


async def test_two_operators_one_leads_and_the_other_takes_over(
    kube: Kube, namespace: str, participant: Participant, cluster: Cluster, tmp_path: Path
) -> None:
    first = OperatorProcess(cluster.kubeconfig, namespace, tmp_path / "a")
    second = OperatorProcess(cluster.kubeconfig, namespace, tmp_path / "b")
    first.start()
    second.start()
    try:
        await register(kube, namespace, participant, "undo")
        holder = await eventually(operator_lease_holder(kube, namespace), lambda h: h != "", 30, "a leader")
        leader, standby = (first, second) if first.identity == holder else (second, first)
        for i in range(10):
            await external_saga(kube, namespace, f"ha{i}", [call("undo", n=i), call("undo", n=i)])
        for i in range(10):
            await abort(kube, namespace, f"ha{i}")
        for i in range(10):
            await saga_phase(kube, namespace, f"ha{i}", "Compensated")
        keys = [r.key for r in participant.received()]
        assert len(keys) == 20
        assert len(set(keys)) == 20  # each compensation made by exactly one operator, once

        # Kill the leader while it compensates; the standby finishes the work.
        participant.handle("/undo", lambda request: Reply(200, delay=1.0))
        for i in range(10, 15):
            await external_saga(kube, namespace, f"ha{i}", [call("undo", n=i), call("undo", n=i)])
        for i in range(10, 15):
            await abort(kube, namespace, f"ha{i}")
        await participant.until(lambda received: len(received) > 20)
        leader.kill()
        killed_at = time.monotonic()
        new_holder = await eventually(
            operator_lease_holder(kube, namespace), lambda h: h not in ("", holder), 60, "new leader"
        )
        handed_over = time.monotonic() - killed_at
        assert new_holder == standby.identity
        for i in range(10, 15):
            await saga_phase(kube, namespace, f"ha{i}", "Compensated", within=60)
        after = participant.received()[20:]
        by_key: dict[str, int] = {}
        for request in after:
            by_key[request.key] = by_key.get(request.key, 0) + 1
        assert len(by_key) == 10  # every entry undone; a repeat only under its own key
        first_call_after = (
            min(r.at for r in after if r.at > killed_at) if any(r.at > killed_at for r in after) else None
        )
        print(f"\nHA hand-over: Lease taken {handed_over:.1f} s after kill -9 (lease 4 s)")
        if first_call_after is not None:
            print(f"first compensation by the new leader {first_call_after - killed_at:.1f} s after the kill")
        assert handed_over < 4 * 2 + 2
    finally:
        first.stop()
        second.stop()


def test_values_are_checked_strictly_and_helm_knows_the_kubernetes_it_was_built_for() -> None:
    def template(*sets: str) -> subprocess.CompletedProcess[str]:
        args = [str(BIN / "helm"), "template", "undolog", str(CHART)]
        for value in sets:
            args += ["--set", value]
        return subprocess.run(args, capture_output=True, text=True, check=False)

    # No --kube-version: helm assumes the Kubernetes of its client-go (1.37), not 1.20.
    plain = template()
    assert plain.returncode == 0, plain.stderr
    for typo, where in (
        ("metrics.serviceMonitor.intervall=30s", "'/metrics/serviceMonitor': additional properties 'intervall'"),
        ("resources.limit.cpu=1", "'/resources': additional properties 'limit'"),
        ("metrics.service.typ=NodePort", "'/metrics/service': additional properties 'typ'"),
        ("tolerations[0].effekt=NoSchedule", "'/tolerations/0': additional properties 'effekt'"),
        ("readinessProbe.periodSecond=5", "'/readinessProbe': additional properties 'periodSecond'"),
        ("extraVolumeMounts[0].name=ca", "'/extraVolumeMounts/0': missing property 'mountPath'"),
    ):
        refused = template(typo)
        assert refused.returncode != 0, typo
        assert where in refused.stderr, refused.stderr
    assert template("metrics.serviceMonitor.interval=1m30s", "resources.limits.memory=256Mi").returncode == 0
    extra = template(
        "extraEnv[0].name=SSL_CERT_FILE", "extraEnv[0].value=/ca/bundle.pem", "extraVolumes[0].name=ca",
        "extraVolumes[0].configMap.name=corporate-ca", "extraVolumeMounts[0].name=ca",
        "extraVolumeMounts[0].mountPath=/ca",
        "serviceAccount.automount=false",
    )  # fmt: skip
    assert extra.returncode == 0, extra.stderr
    deployment = next(d for d in yaml.safe_load_all(extra.stdout) if d and d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert {"name": "SSL_CERT_FILE", "value": "/ca/bundle.pem"} in container["env"]
    assert {"name": "ca", "mountPath": "/ca"} in container["volumeMounts"]
    assert {"name": "ca", "configMap": {"name": "corporate-ca"}} in pod["volumes"]
    assert pod["automountServiceAccountToken"] is False
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}


def test_the_chart_as_a_subchart_with_global_values_and_the_naming_conventions(tmp_path: Path) -> None:
    parent = tmp_path / "platform"
    shutil.copytree(CHART, parent / "charts" / "undolog")
    (parent / "Chart.yaml").write_text("apiVersion: v2\nname: platform\nversion: 1.0.0\n")
    extra = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "{{ .Release.Name }}-extra"}}
    values = {
        # A parent's global, given to every subchart: a mirror and its pull secret, for every pod.
        "global": {"imageRegistry": "registry.example", "imagePullSecrets": [{"name": "mirror-pull"}]},
        "undolog": {
            "fullnameOverride": "undo",
            "commonLabels": {"team": "payments"},
            "extraObjects": [extra],
            "dashboard": {"enabled": True},
            "gateway": {"enabled": True, "config": {"auth": "none"}},
        },
    }
    (parent / "values.yaml").write_text(yaml.safe_dump(values))
    args = [str(BIN / "helm"), "template", "rel", str(parent), "--kube-version", "1.37.2", "-n", "platform"]
    done = subprocess.run(args, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    documents = [d for d in yaml.safe_load_all(done.stdout) if d]
    named = {(d["kind"], d["metadata"]["name"]) for d in documents}
    assert {("Deployment", "undo"), ("ServiceAccount", "undo"), ("ConfigMap", "rel-extra")} <= named
    made = [d for d in documents if d["kind"] != "CustomResourceDefinition" and d["metadata"]["name"] != "rel-extra"]
    assert all(d["metadata"]["labels"]["team"] == "payments" for d in made)
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    pods = [d["spec"]["template"]["spec"] for d in documents if d["kind"] == "Deployment"]
    assert len(pods) == 3  # the operator, the dashboard and the gateway
    for pod in pods:
        assert pod["imagePullSecrets"] == [{"name": "mirror-pull"}]
        assert {c["image"] for c in pod["containers"]} == {f"registry.example/undolog/undolog:{version}"}


def test_the_catalog_as_chart_values_gives_the_gateway_a_configuration_it_loads(tmp_path: Path) -> None:
    """Each catalog file (-f, and all of them at once) renders a gateway.yaml that `undolog mcp`
    loads (schema and expressions), with the chart's operatorCalls and a signing Secret it names."""
    catalog = sorted((CHART / "catalog").glob("*.yaml"))
    for files in [[f] for f in catalog] + [catalog]:
        args = [str(BIN / "helm"), "template", "undolog", str(CHART), "--kube-version", "1.37.2", "-n", "agents"]
        args += ["--set", "gateway.enabled=true", "--set", "gateway.config.auth=none"]
        args += [a for f in files for a in ("-f", str(f))]
        documents = [
            d for d in yaml.safe_load_all(subprocess.run(args, capture_output=True, text=True, check=True).stdout) if d
        ]
        configmap = next(
            d for d in documents if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "undolog-gateway"
        )
        path = tmp_path / "gateway.yaml"
        path.write_text(configmap["data"]["gateway.yaml"])
        config = load(str(path))
        assert {u for f in files for u in yaml.safe_load(f.read_text())["gateway"]["config"]["upstreams"]} == set(
            config.upstreams
        )
        assert config.operator_calls.url == "http://undolog-gateway.agents.svc:80"
        secret = next(
            d for d in documents if d["kind"] == "Secret" and d["metadata"]["name"] == "undolog-gateway-operator-calls"
        )
        assert secret["metadata"]["labels"]["undolog.io/webhook-headers"] == "true"
        assert base64.b64decode(secret["data"]["key"]).startswith(b"whsec_")


def test_the_chart_refuses_a_gateway_whose_auth_is_not_said_and_binds_token_review_when_asked() -> None:
    args = [str(BIN / "helm"), "template", "undolog", str(CHART), "--kube-version", "1.37.2", "-n", "agents"]
    done = subprocess.run([*args, "--set", "gateway.enabled=true"], capture_output=True, text=True, check=False)
    assert done.returncode != 0
    assert "gateway.config.auth: say who may call the gateway" in done.stderr
    reviewing = rendered(
        "gateway.enabled=true",
        "gateway.config.auth.resource=https://undolog-gateway.agents.svc/mcp",
        "gateway.config.auth.serviceAccounts=true",
    )
    [binding] = [d for d in reviewing if d["kind"] == "ClusterRoleBinding" and "gateway" in d["metadata"]["name"]]
    assert binding["roleRef"]["name"] == "system:auth-delegator"
    assert not [
        d
        for d in rendered("gateway.enabled=true", "gateway.config.auth=none")
        if d["kind"] == "ClusterRoleBinding" and "gateway" in d["metadata"]["name"]
    ]


def test_the_gateway_is_reached_by_agents_and_the_operator_only_and_serves_its_tenants_namespaces() -> None:
    documents = rendered("gateway.enabled=true", "gateway.config.auth=none", "gateway.tenantNamespaces={team-a,team-b}")
    policies = {d["metadata"]["name"]: d["spec"] for d in documents if d["kind"] == "NetworkPolicy"}
    operator, gateway = policies["undolog"], policies["undolog-gateway"]
    beside = [{"key": "app.kubernetes.io/component", "operator": "DoesNotExist"}]
    assert operator["podSelector"]["matchExpressions"] == beside  # not the gateway's pods, nor the dashboard's
    assert gateway["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "gateway"
    [door] = gateway["ingress"]
    assert door["ports"] == [{"port": "mcp", "protocol": "TCP"}]
    operator_pods, agents = door["from"]
    assert operator_pods["podSelector"]["matchExpressions"] == beside
    assert agents == {"namespaceSelector": {}, "podSelector": {"matchLabels": {"undolog.io/agent": "true"}}}
    tenants = {
        d["metadata"]["namespace"]
        for d in documents
        if d["kind"] == "Role" and d["metadata"]["name"] == "undolog-gateway"
    }
    assert {"team-a", "team-b"} <= tenants
    bound = [d for d in documents if d["kind"] == "RoleBinding" and d["metadata"]["namespace"] == "team-a"]
    assert bound[0]["subjects"] == [
        {"kind": "ServiceAccount", "name": "undolog-gateway", "namespace": "undolog-system"}
    ]


def test_every_alert_links_its_section_of_the_runbook() -> None:
    rule = next(d for d in rendered("metrics.prometheusRule.enabled=true") if d["kind"] == "PrometheusRule")
    sections = {line[3:].strip().lower() for line in (REPO / "docs" / "runbook.md").read_text().splitlines()
                if line.startswith("## ")}  # fmt: skip
    alerts = [r for group in rule["spec"]["groups"] for r in group["rules"]]
    assert alerts
    for alert in alerts:
        page, _, anchor = alert["annotations"]["runbook_url"].partition("#")
        assert page.endswith("/docs/runbook.md")
        assert anchor == alert["alert"].lower() in sections, alert["alert"]


def test_the_service_monitor_keeps_the_sagas_namespace_and_takes_its_relabelings() -> None:
    monitor = next(
        d
        for d in rendered(
            "metrics.serviceMonitor.enabled=true",
            "metrics.serviceMonitor.namespace=monitoring",
            "metrics.serviceMonitor.metricRelabelings[0].action=drop",
            "metrics.serviceMonitor.metricRelabelings[0].regex=undolog_compensation_duration_seconds.*",
            "metrics.serviceMonitor.metricRelabelings[0].sourceLabels[0]=__name__",
        )
        if d["kind"] == "ServiceMonitor"
    )
    assert monitor["metadata"]["namespace"] == "monitoring"
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["undolog-system"]}
    endpoint = monitor["spec"]["endpoints"][0]
    assert endpoint["honorLabels"] is True  # else `namespace` (the saga's) becomes exported_namespace
    assert endpoint["metricRelabelings"][0]["action"] == "drop"
