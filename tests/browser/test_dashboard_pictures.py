"""The dashboard's pictures in a real browser (Debian's chromium), on a saga the real operator ran:
its calls on a time axis (forward calls, a failed step, compensations that ran together, a
retry, the halt), its dependency graph, and the overview of the installation. What the pictures
show is read back from the page; screenshots go where the dashboard's do."""

from __future__ import annotations

import pytest
from playwright.async_api import Page, expect

from tests.browser.conftest import Dashboard
from tests.browser.test_dashboard import SCREENSHOTS
from tests.cluster.test_compensation import register
from tests.support.manifests import call, saga
from tests.support.operator_process import OperatorProcess
from tests.support.participants import Participant, Reply
from tests.support.waiting import saga_phase
from undolog.kube import Kube

pytestmark = pytest.mark.cluster


def step(name: str, *depends_on: str) -> dict[str, object]:
    body: dict[str, object] = {"name": name, "action": call(f"{name}-do"), "compensation": call(f"{name}-undo")}
    if depends_on:
        body["dependsOn"] = list(depends_on)
    return body


async def halted_with_waves(kube: Kube, namespace: str, participant: Participant) -> None:
    """a; b and c each depend on a alone; d (no dependsOn: on all below) is refused going forward.
    Undone: d, then b and c together, then a, which answers 503 (retried) and then 400: halted."""
    participant.script("/d-do", Reply(400, {"error": "no such plan"}))
    for together in ("/b-undo", "/c-undo"):
        participant.handle(together, lambda request: Reply(200, delay=0.4))
    participant.script("/a-undo", Reply(503), Reply(400, {"error": "account locked"}))
    await register(kube, namespace, participant, *(f"{s}-{k}" for s in "abcd" for k in ("do", "undo")))
    steps = [step("a"), step("b", "a"), step("c", "a"), step("d")]
    await kube.create("sagas", namespace, saga("waves", steps))
    await saga_phase(kube, namespace, "waves", "Halted", within=60)


async def test_a_saga_s_calls_are_drawn_in_time_and_its_dependencies_as_a_graph(
    kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess, dashboard: Dashboard, page: Page
) -> None:
    await halted_with_waves(kube, namespace, participant)
    await page.goto(f"{dashboard.url}/sagas/{namespace}/waves")
    drawn = page.get_by_role("img", name="Calls of each entry on a time axis")
    await expect(drawn).to_be_visible()
    await expect(drawn.locator("rect.call.forward")).to_have_count(4)
    await expect(drawn.locator("rect.call.forward.failed")).to_have_count(1)  # d, refused
    await expect(drawn.locator("rect.call.forward.failed title")).to_contain_text("#4 d: forward call 1")
    await expect(drawn.locator("rect.together title")).to_have_text(["ran together: #3, #2"])
    retry = drawn.locator("rect.call.compensation.failed.retry title")
    await expect(retry).to_contain_text(["#1 a: compensation call 2"])
    await expect(retry).to_contain_text(["HTTP 400"])
    await expect(drawn.locator("line.mark.halt")).to_have_count(1)
    # On the time axis, in the order they happened: d's undo, the wave of b and c, then a's.
    bars = await drawn.locator("rect.call.compensation").evaluate_all(
        "rects => rects.map(r => [r.querySelector('title').textContent, Number(r.getAttribute('x'))])"
    )
    first_x: dict[int, float] = {}
    for title, x in bars:  # "#4 d: compensation call 1 at ..."
        position = int(title.split()[0].removeprefix("#"))
        first_x[position] = min(x, first_x.get(position, x))
    assert first_x[4] < min(first_x[3], first_x[2]) <= max(first_x[3], first_x[2]) < first_x[1], first_x
    halt_x = float(await drawn.locator("line.mark.halt").get_attribute("x1") or "nan")
    assert halt_x >= first_x[1]

    graph = page.get_by_role("img", name="Which step depends on which")
    await expect(graph.locator("g.node")).to_have_count(4)
    await expect(graph.locator("line.edge")).to_have_count(4)  # a->b, a->c, b->d, c->d (a->d through them)
    as_text = page.get_by_role("list", name="Dependencies as text")
    await expect(as_text.get_by_role("listitem")).to_have_text(
        ["#1 a depends on no step", "#2 b depends on #1 a", "#3 c depends on #1 a", "#4 d depends on #2 b, #3 c"]
    )
    await page.screenshot(path=str(SCREENSHOTS / "dashboard-timeline.png"), full_page=True)


async def test_the_overview_shows_the_sagas_by_phase_what_halted_on_what_and_the_hours_compensations(
    kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess, dashboard: Dashboard, page: Page
) -> None:
    await halted_with_waves(kube, namespace, participant)
    await register(kube, namespace, participant, "e-do", "e-undo")
    await kube.create("sagas", namespace, saga("done", [step("e")]))
    await saga_phase(kube, namespace, "done", "Completed", within=30)
    await page.goto(f"{dashboard.url}/overview?namespace={namespace}")
    phases = page.get_by_role("img", name="Sagas by phase")
    await expect(phases.locator("rect.bar.halted title")).to_have_text("Halted: 1")
    await expect(phases.locator("rect.bar.completed title")).to_have_text("Completed: 1")
    await expect(page.get_by_role("heading", name="Sagas by phase")).to_contain_text("2 in all")
    halted = page.get_by_role("region", name="Halted, by the function they wait on")
    await expect(halted.get_by_role("row").nth(1)).to_have_text(f"a-undo{namespace}1")
    await expect(page.get_by_role("heading", name="Compensations in the last hour")).to_contain_text("3 entries undone")
    hour = page.get_by_role("img", name="Entries compensated in each five minutes of the last hour")
    await expect(hour.locator("rect.bar")).to_have_count(12)
    await expect(hour.locator("rect.bar").last.locator("title")).to_have_text("-5 min: 3")
    await page.get_by_role("link", name="a-undo").click()  # the Webhook, one click away
    await expect(page.get_by_role("heading", name="a-undo")).to_be_visible()
    await page.goto(f"{dashboard.url}/overview?namespace={namespace}")
    await page.screenshot(path=str(SCREENSHOTS / "dashboard-overview.png"), full_page=True)
