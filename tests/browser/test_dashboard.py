"""The triage dashboard in a real browser (Debian's chromium, driven by Playwright), against the
real apiserver and the real operator: a halted saga appears live, a retry from the page
compensates it and records who asked, a viewer without `patch` sees the API's refusal, the
filters live in the URL, a batch retry after a fix. Screenshots go to build/screenshots/, or to
docs/ with `make screenshots`."""

from __future__ import annotations

import asyncio
import os
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from devtools.control_plane.local import free_port
from devtools.postgres import LocalPostgres
from playwright.async_api import Page, Route, expect

from tests.browser.conftest import Dashboard
from tests.cluster.test_cli import halted_saga
from tests.cluster.test_compensation import abort, external_saga, register
from tests.cluster.test_object_undo import MERGE, apps, deployment
from tests.cluster.test_retention import deleted
from tests.conftest import REPO, Cluster, own_control_plane
from tests.support.identities import create_service_account, service_account_token
from tests.support.manifests import call, saga
from tests.support.operator_process import OperatorProcess
from tests.support.participants import Participant, Reply
from tests.support.waiting import eventually, saga_phase
from undolog.kube import Kube
from undolog.sdk import open_saga
from undolog.sdk.objects import changing

pytestmark = pytest.mark.cluster
# Where screenshots go: build/ by default, so a test run leaves the tree as it was; `make
# screenshots` points this at docs/ when the pictures there should change.
SCREENSHOTS = Path(os.environ.get("UNDOLOG_SCREENSHOTS", REPO / "build" / "screenshots"))


async def test_a_halted_saga_appears_live_and_a_retry_from_the_page_compensates_it(
    kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess, dashboard: Dashboard, page: Page
) -> None:
    participant.script("/revoke", Reply(400, {"error": "no such grant"}))
    participant.handle("/unsend", lambda request: Reply(200, delay=1.0))  # time to watch it move
    await register(kube, namespace, participant, "delete-user", "revoke", "unsend")
    await external_saga(kube, namespace, "stuck", [call("delete-user"), call("revoke"), call("unsend")], orgId="acme")
    await saga_phase(kube, namespace, "stuck", "Active")
    await page.goto(f"{dashboard.url}/sagas?namespace={namespace}")
    await expect(page.get_by_role("link", name="stuck")).to_be_visible()
    await expect(page.locator("body[data-live=ready]")).to_be_attached()  # its watch is up: no change missed
    await abort(kube, namespace, "stuck")
    await saga_phase(kube, namespace, "stuck", "Halted")
    halted_at = time.monotonic()
    halted_row = page.locator("tr.phase-halted", has_text="stuck")
    await expect(halted_row).to_be_visible(timeout=2000)  # live: no reload
    shown_after = time.monotonic() - halted_at
    print(f"\nhalted saga shown {shown_after * 1000:.0f} ms after it halted")
    assert shown_after < 2.0
    await expect(halted_row).to_contain_text("CompensationFailed")
    await page.screenshot(path=str(SCREENSHOTS / "dashboard-list.png"), full_page=True)

    await page.get_by_role("link", name="stuck").click()
    stack = page.get_by_role("region", name="Undo stack (newest on top)")
    await expect(stack.get_by_role("heading", level=3).first).to_contain_text("#3 step3")
    await expect(stack).to_contain_text("HTTP 400")
    order = page.get_by_role("region", name="Compensation order (what runs together)")
    await expect(order.get_by_role("listitem")).to_have_text(["#2 step2", "#1 step1"])
    await expect(page.get_by_role("link", name="revoke").first).to_be_visible()  # the Webhook, one click away
    await page.screenshot(path=str(SCREENSHOTS / "dashboard-saga.png"), full_page=True)

    await page.get_by_label("Reason for the retry").fill("grant restored, INC-42")
    await page.get_by_role("button", name="Retry").click()
    await expect(page.get_by_role("status").first).to_contain_text("retry requested")
    # The saga's own state heading: by name, "Compensated" also matched each compensated entry's
    # heading (it passed on entry 3's before the retry; two at once failed in strict mode).
    await expect(page.locator("h2#state")).to_contain_text("Compensated: Compensated", timeout=15000)
    done = await saga_phase(kube, namespace, "stuck", "Compensated")
    said = "grant restored, INC-42 (by undolog-admin"
    assert any(said in c["message"] for c in done["status"]["conditions"])  # who asked, and why
    events = await eventually(
        lambda: kube.events_about(namespace, "stuck"),
        lambda found: any(said in e.message for e in found),
        10,
        "an Event naming the reason and the viewer",
    )
    assert any(e.reason == "Compensating" and said in e.message for e in events)
    print("\n".join(f"{e.type} {e.reason}: {e.message}" for e in events))

    await page.get_by_role("link", name="revoke").first.click()
    await expect(page.get_by_role("heading", name="Webhook revoke")).to_be_visible()
    await expect(page.locator("code")).to_contain_text(participant.url("/revoke"))


async def reader_token(kube: Kube, namespace: str) -> str:
    """A token of a ServiceAccount that may read sagas, entries, Webhooks and Events, and no more."""
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}"
    read = ["get", "list", "watch"]
    rules = [
        {"apiGroups": ["undolog.io"], "resources": ["sagas", "undoentries", "webhooks"], "verbs": read},
        {"apiGroups": [""], "resources": ["events"], "verbs": read},
    ]
    await kube.request("POST", f"{rbac}/roles", {"metadata": {"name": "viewer"}, "rules": rules})
    await create_service_account(kube, namespace, "viewer")
    binding = {
        "metadata": {"name": "viewer"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "viewer"},
        "subjects": [{"kind": "ServiceAccount", "name": "viewer", "namespace": namespace}],
    }
    await kube.request("POST", f"{rbac}/rolebindings", binding)
    return await service_account_token(kube, namespace, "viewer")


@pytest.fixture
def token_dashboard(cluster: Cluster, kube: Kube, tmp_path: Path) -> Iterator[Dashboard]:
    """In-cluster mode: the dashboard acts with the token the viewer signs in with, never its own."""
    assert cluster.local is not None
    served = Dashboard(
        cluster,
        tmp_path / "dashboard.log",
        "--auth=token",
        f"--api-server={kube.server}",
        f"--api-ca-file={cluster.local.pki / 'serving-ca.crt'}",
    )
    yield served
    served.stop()


async def sign_in(page: Page, token: str) -> None:
    await expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    await page.get_by_label("Bearer token").fill(token)
    await page.get_by_role("button", name="Sign in").click()


async def test_a_viewer_without_patch_sees_the_apis_refusal(
    kube: Kube,
    namespace: str,
    participant: Participant,
    operator: OperatorProcess,
    token_dashboard: Dashboard,
    page: Page,
) -> None:
    await halted_saga(kube, namespace, participant)
    token = await reader_token(kube, namespace)
    await page.goto(f"{token_dashboard.url}/sagas/{namespace}/stuck")
    await sign_in(page, token)
    await expect(page.get_by_text(f"Signed in as system:serviceaccount:{namespace}:viewer")).to_be_visible()
    message = (await kube.get("sagas", namespace, "stuck"))["status"]["message"]
    await expect(page.get_by_text(message, exact=True)).to_have_count(1)  # the halt message once, not per condition
    await page.get_by_label("Reason for the retry").fill("trying")
    await page.get_by_role("button", name="Retry").click()
    refusal = page.get_by_role("alert")
    await expect(refusal).to_contain_text(f'User "system:serviceaccount:{namespace}:viewer" cannot patch')
    await expect(refusal).to_contain_text("forbidden")
    print(f"\nshown to the viewer: {await refusal.inner_text()}")
    # Their view is theirs: another namespace is not listed for them.
    await page.goto(f"{token_dashboard.url}/sagas?namespace=default")
    await expect(page.get_by_role("alert")).to_contain_text("forbidden")
    assert (await kube.get("sagas", namespace, "stuck"))["status"]["phase"] == "Halted"  # nothing was changed


@pytest.fixture
def other_site() -> Iterator[tuple[int, list[str]]]:
    """Another site on loopback, made to look like the dashboard: its port, and the paths asked of it."""
    asked: list[str] = []

    class Phish(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(b"<h1>Sign in again</h1>")

        def log_message(self, format: str, *args: object) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Phish)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1], asked
    server.shutdown()
    server.server_close()


async def test_a_person_rewinds_an_active_saga_from_its_page_and_finds_sagas_by_name(
    kube: Kube,
    namespace: str,
    participant: Participant,
    operator: OperatorProcess,
    dashboard: Dashboard,
    page: Page,
) -> None:
    await register(kube, namespace, participant, "undo")
    await external_saga(kube, namespace, "booking", [call("undo", step=1), call("undo", step=2), call("undo", step=3)])
    await saga_phase(kube, namespace, "booking", "Active")
    await page.goto(f"{dashboard.url}/sagas/{namespace}/booking")
    await page.get_by_label("Rewind to step").select_option(label="1. step1")
    await page.get_by_label("Reason for the rewind").fill("the second and third were booked twice")
    await page.get_by_role("button", name="Rewind").click()
    await expect(page.get_by_role("status")).to_contain_text("rewind of")
    rewound = await eventually(
        lambda: kube.get("sagas", namespace, "booking"),
        lambda body: (body.get("status", {}).get("rewind") or {}).get("state") == "Done",
        30,
        "the rewind done",
    )
    assert rewound["status"]["phase"] == "Active"
    undone = [r.body["step"] for r in participant.received("/undo")]
    assert undone == [3, 2], undone  # newest first, the first step kept
    assert "the second and third were booked twice" in rewound["spec"]["rewind"]["reason"]

    for n in range(3):
        await kube.create("sagas", namespace, saga(f"order-{n}"))
    await page.goto(f"{dashboard.url}/sagas?namespace={namespace}&name=order-")
    table = page.get_by_role("table")
    await expect(table.get_by_role("link", name="order-0")).to_be_visible()
    await expect(table.get_by_role("link", name="booking")).to_have_count(0)
    await expect(page.get_by_role("caption")).to_contain_text("3 saga(s)")


class AuthenticatingProxy:
    """What oauth2-proxy does once a person signed in with OIDC: every request passed on to the
    dashboard with the person's token in X-Forwarded-Access-Token (a real HTTP hop, on loopback)."""

    def __init__(self, upstream: str, token: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        upstream_host = upstream.removeprefix("http://")

        class Forward(BaseHTTPRequestHandler):
            def forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                headers |= {"Host": upstream_host, "X-Forwarded-Access-Token": token}
                request = urllib.request.Request(f"{upstream}{self.path}", body, headers, method=self.command)
                opener = urllib.request.build_opener(NoRedirect)
                try:
                    answer = opener.open(request, timeout=30)
                except urllib.error.HTTPError as refused:
                    answer = refused
                payload = answer.read()
                self.send_response(answer.status)
                for key, value in answer.headers.items():
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = forward

            def log_message(self, *_: object) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Forward)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *_: object, **__: object) -> None:
        return None  # the browser follows redirects itself


async def test_behind_an_oidc_proxy_under_a_path_the_dashboard_acts_with_the_token_it_passes_and_refuses_the_rest(
    cluster: Cluster,
    kube: Kube,
    namespace: str,
    participant: Participant,
    operator: OperatorProcess,
    tmp_path: Path,
    page: Page,
) -> None:
    assert cluster.local is not None
    await halted_saga(kube, namespace, participant)
    token = await reader_token(kube, namespace)
    served = Dashboard(
        cluster,
        tmp_path / "dashboard.log",
        "--auth=proxy",
        f"--api-server={kube.server}",
        f"--api-ca-file={cluster.local.pki / 'serving-ca.crt'}",
        "--base-path=/undolog",  # the proxy serves other things at its root, and passes the path on
    )
    proxy = AuthenticatingProxy(served.url, token)
    try:
        await page.goto(f"{proxy.url}/undolog/sagas/{namespace}/stuck")
        await expect(page.get_by_text(f"Signed in as system:serviceaccount:{namespace}:viewer")).to_be_visible()
        await expect(page.get_by_role("heading", name="stuck")).to_be_visible()
        # Its live events under the path too (this proxy reads whole answers, so no stream passes it).
        assert (await page.locator("body").get_attribute("data-events") or "").startswith("/undolog/events?")
        assert await page.evaluate("getComputedStyle(document.body).maxWidth") == "1152px"  # its stylesheet
        await page.get_by_role("link", name="Overview").click()
        await expect(page).to_have_url(f"{proxy.url}/undolog/overview")
        await expect(page.get_by_role("alert")).to_contain_text("cannot list resource")  # at the cluster scope
        await page.goto(f"{proxy.url}/undolog/overview?namespace={namespace}")
        await expect(page.get_by_role("img", name="Sagas by phase").locator("rect.bar.halted title")).to_have_text(
            "Halted: 1"
        )
        # Around the proxy there is no way in: no login page, no cookie, a 401 that says why.
        direct = await page.goto(f"{served.url}/undolog/sagas/{namespace}/stuck")
        assert direct is not None
        assert direct.status == 401
        await expect(page.get_by_text("no X-Forwarded-Access-Token header")).to_be_visible()
        assert (await page.goto(f"{served.url}/undolog/login")).status == 404  # type: ignore[union-attr]
        assert (await page.goto(f"{served.url}/sagas")).status == 404  # type: ignore[union-attr]
    finally:
        proxy.stop()
        served.stop()


@pytest.mark.parametrize("elsewhere", ["/%09/127.0.0.1:{port}/", "//127.0.0.1:{port}/", "/%5C127.0.0.1:{port}/"])
async def test_a_sign_in_link_never_leads_to_another_site(
    kube: Kube,
    namespace: str,
    token_dashboard: Dashboard,
    other_site: tuple[int, list[str]],
    page: Page,
    elsewhere: str,
) -> None:
    """Anyone can send a link to the login page with a `next` of their choosing. A tab in it
    ("/<tab>/host") passed the check on the text and was written "//host": the viewer, just
    signed in, landed on another site made to look like this one."""
    port, asked = other_site
    token = await reader_token(kube, namespace)
    await page.goto(f"{token_dashboard.url}/login?next=" + elsewhere.format(port=port))
    await sign_in(page, token)
    await expect(page).not_to_have_url(re.compile(r".*/login"))  # the sign-in's redirect was followed
    assert page.url.startswith(token_dashboard.url + "/"), page.url
    assert asked == []


async def test_the_filters_live_in_the_url_and_a_batch_retry_after_a_fix(
    kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess, dashboard: Dashboard, page: Page
) -> None:
    participant.script("/refund", Reply(400), Reply(400))
    await register(kube, namespace, participant, "refund", "release")
    for name in ("pay-1", "pay-2"):
        await external_saga(kube, namespace, name, [call("release"), call("refund")], orgId="shop")
        await abort(kube, namespace, name)
    opened_for = "system:serviceaccount:team-b:agent"
    await external_saga(kube, namespace, "open", [call("release")], orgId="other", principal=opened_for)
    steps = [{"name": "one", "action": {"function": "release"}, "compensation": {"function": "release"}}]
    await kube.create("sagas", namespace, saga("done", steps))
    for name in ("pay-1", "pay-2"):
        await saga_phase(kube, namespace, name, "Halted")
    await saga_phase(kube, namespace, "done", "Completed")

    await page.goto(f"{dashboard.url}/sagas?namespace={namespace}")
    rows = page.locator("table.sagas tbody tr")
    await expect(rows).to_have_count(4)
    await expect(rows.first).to_contain_text("Halted")  # halted first
    await page.get_by_label("Phase").select_option("Halted")
    await page.get_by_role("button", name="Filter").click()
    await expect(page).to_have_url(
        f"{dashboard.url}/sagas?namespace={namespace}&name=&phase=Halted&org=&principal=&function=&older_than="
    )
    await expect(rows).to_have_count(2)
    for typed, said in (("15x", "is not a duration such as 90s"), ("1000000000d", "is longer than any age")):
        await page.goto(f"{dashboard.url}/sagas?namespace={namespace}&older_than={typed}")
        await expect(page.get_by_role("alert")).to_contain_text(f"older than: '{typed}' {said}")
    await page.goto(f"{dashboard.url}/sagas?namespace={namespace}&org=other")
    await expect(rows).to_have_count(1)
    await expect(rows.first).to_contain_text("open")
    await page.goto(f"{dashboard.url}/sagas?namespace={namespace}&principal={opened_for}")
    await expect(rows).to_have_count(1)
    await expect(rows.first).to_contain_text("open")
    await page.goto(f"{dashboard.url}/sagas/{namespace}/open")
    await expect(page.get_by_text(f"opened for {opened_for}")).to_be_visible()
    await page.goto(f"{dashboard.url}/sagas?namespace={namespace}&function=refund")
    await expect(rows).to_have_count(2)  # the sagas that call refund to undo a step

    await page.goto(f"{dashboard.url}/sagas?namespace={namespace}&phase=Halted")
    await page.get_by_label("Fixed function").fill("refund")
    await page.get_by_label("Reason").fill("refund service fixed")
    await page.get_by_role("button", name="Retry every saga halted on it").click()
    await expect(page.get_by_role("status").first).to_contain_text("retry requested for 2 saga(s) halted on refund")
    for name in ("pay-1", "pay-2"):
        await saga_phase(kube, namespace, name, "Compensated")


async def test_a_live_page_never_has_more_than_one_refresh_in_flight_however_fast_sagas_change(
    kube: Kube, namespace: str, dashboard: Dashboard, page: Page
) -> None:
    """Each change refreshed the page 100 ms later, whether or not the last refresh had come back:
    with a listing that takes longer than that (thousands of sagas) and sagas changing all the
    time, one open page kept several LISTs of everything in flight, without end."""
    await kube.create("sagas", namespace, saga("busy"))
    in_flight, most, fetched = 0, 0, 0

    async def slow(route: Route) -> None:  # a listing that takes 600 ms, as a large one does
        nonlocal in_flight, most, fetched
        in_flight += 1
        most = max(most, in_flight)
        try:
            await asyncio.sleep(0.6)
            await route.continue_()
        finally:
            in_flight -= 1
            fetched += 1

    await page.route(re.compile(r".*[?&]fragment=1"), slow)
    await page.goto(f"{dashboard.url}/sagas?namespace={namespace}")
    await expect(page.locator("body[data-live=ready]")).to_be_attached()
    for n in range(30):  # a change every 50 ms for 1.5 s
        await kube.patch("sagas", namespace, "busy", {"metadata": {"annotations": {"example.com/n": str(n)}}})
        await asyncio.sleep(0.05)

    async def refreshes() -> int:
        return fetched

    await eventually(refreshes, lambda n: n >= 2, 10, "the page refreshed")
    await page.get_by_role("link", name="busy").wait_for()
    assert most == 1, f"{most} refreshes in flight at once"


async def test_a_live_page_stays_live_through_an_apiserver_restart(tmp_path: Path, page: Page) -> None:
    """The apiserver restarts (an upgrade) while a page is open: its stream ends, and while the
    API is down the dashboard cannot start another. The page says it is not live meanwhile,
    and once the API is back a change shows without a reload."""
    async with own_control_plane(tmp_path) as own:
        served = Dashboard(
            Cluster(own.kubeconfig, own.local), tmp_path / "dashboard.log", f"--kubeconfig={own.kubeconfig}"
        )
        try:
            namespace = own.namespace
            await own.kube.create("sagas", namespace, saga("before"))
            await page.goto(f"{served.url}/sagas?namespace={namespace}")
            await expect(page.locator("body[data-live=ready]")).to_be_attached()
            restarted = asyncio.ensure_future(asyncio.to_thread(own.local.restart, "kube-apiserver", 6.0))
            await expect(page.locator("body[data-live=reconnecting]")).to_be_attached(timeout=10000)
            await expect(page.get_by_role("status").filter(has_text="not live")).to_be_visible()
            await restarted
            await expect(page.locator("body[data-live=ready]")).to_be_attached(timeout=20000)
            await own.kube.create("sagas", namespace, saga("after"))
            await expect(page.get_by_role("link", name="after")).to_be_visible(timeout=5000)  # live again
            await expect(page.get_by_role("status").filter(has_text="not live")).to_be_hidden()
        finally:
            served.stop()


async def test_the_history_view_finds_a_saga_retention_deleted_and_shows_its_archived_record(
    cluster: Cluster,
    kube: Kube,
    namespace: str,
    participant: Participant,
    tmp_path: Path,
    postgres: LocalPostgres,
    page: Page,
) -> None:
    operator = OperatorProcess(
        cluster.kubeconfig, namespace, tmp_path, (f"--archive-dsn={postgres.dsn}", "--ttl-after-compensated=1s")
    )
    operator.start()
    try:
        # Every refund's first attempt fails with a 503: its record keeps it.
        participant.handle(
            "/refund", lambda r: Reply(503) if r.headers.get("undolog-attempt") == "1" else Reply(200, {})
        )
        await register(kube, namespace, participant, "refund")
        for name in ("order-1", "order-2", "order-3"):
            await external_saga(kube, namespace, name, [call("refund", amount=5)])
            await abort(kube, namespace, name)
        for name in ("order-1", "order-2", "order-3"):
            await deleted(kube, namespace, name, within=60)
    finally:
        operator.stop()
    served = Dashboard(
        cluster, tmp_path / "dashboard.log", f"--kubeconfig={cluster.kubeconfig}", f"--archive-dsn={postgres.dsn}"
    )
    try:
        await page.goto(f"{served.url}/sagas?namespace={namespace}")
        await expect(page.get_by_role("cell", name="No sagas match.")).to_be_visible()  # gone from the cluster
        await page.get_by_role("link", name="History").click()
        await page.get_by_label("Namespace").fill(namespace)
        await page.get_by_role("button", name="Filter").click()
        rows = page.locator("table.history tbody tr")
        await expect(rows).to_have_count(3)
        await expect(rows.first).to_contain_text("Compensated")
        assert f"namespace={namespace}" in page.url  # the filters live in the URL
        await page.get_by_role("link", name="order-2").click()
        await expect(page.get_by_role("status").filter(has_text="Archived")).to_be_visible()
        stack = page.get_by_role("region", name="Undo stack (newest on top)")
        await expect(stack).to_contain_text("HTTP 503")  # the retried attempt, kept on the entry
        await expect(page.get_by_role("button", name="Retry")).to_have_count(0)  # read-only
        await page.screenshot(path=str(SCREENSHOTS / "dashboard-history.png"), full_page=True)
    finally:
        served.stop()


async def test_a_conflict_shows_each_field_before_after_and_now_and_a_person_undoes_it_anyway(
    kube: Kube, namespace: str, cluster: Cluster, operator: OperatorProcess, dashboard: Dashboard, page: Page
) -> None:
    """A Deployment scaled 2 → 5 by an agent, then to 10 by someone else: the undo halts as
    Conflict, the page shows spec.replicas before, after and now, and a person who decides the
    10 may go undoes it anyway from the page: back to 2."""
    await kube.request("POST", apps(namespace), deployment("web", 2))
    saga_run = await open_saga(generate_name="agent-", namespace=namespace, kubeconfig=str(cluster.kubeconfig))
    async with changing(saga_run, "scale-web", "deployment", "web", changes={"spec": {"replicas": 0}}):
        await kube.request("PATCH", apps(namespace, "web"), {"spec": {"replicas": 5}}, content_type=MERGE)
    await kube.request("PATCH", apps(namespace, "web"), {"spec": {"replicas": 10}}, content_type=MERGE)
    await saga_run.abort("the agent gave up")
    await saga_run.close()
    await saga_phase(kube, namespace, saga_run.name, "Halted")
    await page.goto(f"{dashboard.url}/sagas/{namespace}/{saga_run.name}")
    stack = page.get_by_role("region", name="Undo stack (newest on top)")
    await expect(stack).to_contain_text(f"natively, deployments.apps web in namespace {namespace}")
    conflict = stack.get_by_role("table", name=re.compile("Changed since the step"))
    await expect(conflict.get_by_role("row", name="spec.replicas").get_by_role("cell")).to_have_text(["2", "5", "10"])
    await page.screenshot(path=str(SCREENSHOTS / "dashboard-conflict.png"), full_page=True)
    await page.get_by_label("Reason to undo #1 anyway").fill("the 10 was a mistake, INC-7")
    await page.get_by_role("button", name="Undo #1 anyway").click()
    await expect(page.get_by_role("status").first).to_contain_text("will be undone anyway")
    await saga_phase(kube, namespace, saga_run.name, "Compensated")
    assert (await kube.request("GET", apps(namespace, "web")))["spec"]["replicas"] == 2
    entry = await kube.get("undoentries", namespace, f"{saga_run.name}-1")
    assert "the 10 was a mistake, INC-7" in entry["status"]["guard"]["overridden"]
