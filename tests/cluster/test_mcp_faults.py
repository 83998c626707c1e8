"""The MCP transport under the faults the HTTP transport is tested with: each test makes the same
fault happen to a compensation over HTTP (a participant) and over MCP (the tracker's close_issue)
in one namespace, and both end the same way, for the same reason."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.cluster.test_compensation import abort, external_saga
from tests.cluster.test_faults import rss_peak_kib
from tests.support.manifests import call, webhook
from tests.support.mcp_tracker import HUGE_BYTES, SLOW_SECONDS, Tracker
from tests.support.operator_process import OperatorProcess
from tests.support.participants import Participant, Reply
from tests.support.waiting import saga_phase
from undolog.inspect import Inspector
from undolog.kube import Body, Kube

pytestmark = pytest.mark.cluster

Webhook = dict[str, Any]


@pytest.fixture
def tracker() -> Iterator[Tracker]:
    served = Tracker()
    yield served
    served.stop()


async def both_webhooks(
    kube: Kube, namespace: str, participant: Participant, tracker: Tracker, tune: Callable[[Webhook], None]
) -> None:
    over_http = webhook("undo", url=participant.url("/undo"))
    over_mcp = webhook("tracker.close-issue", url=tracker.url, mcp={"tool": "close_issue"})
    for hook in (over_http, over_mcp):
        tune(hook)
        await kube.create("webhooks", namespace, hook)


async def compensated_by_both(
    kube: Kube,
    namespace: str,
    participant: Participant,
    tracker: Tracker,
    phase: str,
    tune: Callable[[Webhook], None] | None = None,
    prefix: str = "",
    mcp_phase: str | None = None,
) -> tuple[Body, Body]:
    """One saga per transport (its Webhooks made first, unless `tune` is None), each with one
    entry to compensate, aborted together; the entries once both sagas are in `phase` (the MCP
    one in `mcp_phase`, if given)."""
    if tune is not None:
        await both_webhooks(kube, namespace, participant, tracker, tune)
    number = tracker.issues.open("to undo")
    policy: dict[str, Any] = {"compensationPolicy": {"backoff": {"maxRetries": 1, "initialSeconds": 0.2}}}
    names = f"{prefix}http", f"{prefix}mcp"
    await external_saga(kube, namespace, names[0], [call("undo")], **policy)
    await external_saga(kube, namespace, names[1], [call("tracker.close-issue", number=number)], **policy)
    for name in names:
        await abort(kube, namespace, name)
    for name, ends_in in zip(names, (phase, mcp_phase or phase), strict=True):
        await saga_phase(kube, namespace, name, ends_in, within=60)
    return await kube.get("undoentries", namespace, f"{names[0]}-1"), await kube.get(
        "undoentries", namespace, f"{names[1]}-1"
    )


def ended(entry: Body) -> tuple[str, str | None]:
    status = entry["status"]
    return status["state"], status.get("reason")


def attempt_errors(entry: Body) -> list[str | None]:
    return [attempt.get("error") for attempt in entry["status"].get("attempts", [])]


async def test_a_participant_that_is_down_is_waited_out_for_its_budget_then_halts_both_alike(
    kube: Kube, namespace: str, participant: Participant, tracker: Tracker, operator: OperatorProcess
) -> None:
    participant.down()
    tracker.stop()

    def brief(hook: Webhook) -> None:
        hook["spec"]["outageBudgetSeconds"] = 3

    http, mcp = await compensated_by_both(kube, namespace, participant, tracker, "Halted", brief)
    print(f"\nHTTP: {ended(http)} {http['status']['lastError']!r}\nMCP:  {ended(mcp)} {mcp['status']['lastError']!r}")
    assert ended(http) == ended(mcp) == ("Failed", "ParticipantUnavailable")
    for entry in (http, mcp):  # what the network said, as the HTTP transport says it
        assert "did not answer for its outage budget (3 s; last: ClientConnectorError" in entry["status"]["lastError"]


async def test_a_participant_slower_than_the_timeout_is_asked_again_under_the_same_key_both_alike(
    kube: Kube, namespace: str, participant: Participant, tracker: Tracker, operator: OperatorProcess
) -> None:
    participant.script("/undo", Reply(200, delay=SLOW_SECONDS))
    tracker.issues.faults.append("slow")

    def quick(hook: Webhook) -> None:
        hook["spec"]["timeoutSeconds"] = 2

    http, mcp = await compensated_by_both(kube, namespace, participant, tracker, "Compensated", quick)
    print(f"\nHTTP attempts: {attempt_errors(http)}\nMCP attempts:  {attempt_errors(mcp)}")
    assert ended(http) == ended(mcp) == ("Compensated", None)
    assert attempt_errors(http) == attempt_errors(mcp) == ["timed out after 2 s", None]
    keys = {close.meta_key for close in tracker.issues.closes}
    assert keys == {f"undo-{mcp['spec']['undoId']}"}  # the slow attempt and the retry: one key


async def test_an_is_error_halts_as_a_permanent_refusal_does(
    kube: Kube, namespace: str, participant: Participant, tracker: Tracker, operator: OperatorProcess
) -> None:
    participant.script("/undo", Reply(422, body={"error": "the tracker is read-only today"}))
    tracker.issues.faults.append("error")
    http, mcp = await compensated_by_both(kube, namespace, participant, tracker, "Halted", lambda _: None)
    print(f"\nHTTP: {ended(http)} {http['status']['lastError']!r}\nMCP:  {ended(mcp)} {mcp['status']['lastError']!r}")
    assert ended(http) == ended(mcp) == ("Failed", "PermanentFailure")
    assert len(attempt_errors(mcp)) == 1  # not retried
    said = "tool 'close_issue' answered isError: the tracker is read-only today (permanent failure)"
    assert mcp["status"]["lastError"] == said
    assert tracker.issues.closes == []


async def test_a_huge_answer_is_not_read_into_memory_and_an_unreadable_result_halts(
    kube: Kube, namespace: str, participant: Participant, tracker: Tracker, operator: OperatorProcess
) -> None:
    """Over HTTP the status says the compensation succeeded and the rest of the answer is not
    needed; an MCP tool's result is in the answer, so one too large to read is no success: the
    saga halts for a person, without the answer read into memory."""
    await both_webhooks(kube, namespace, participant, tracker, lambda _: None)
    # The first MCP call loads the client's modules: measured from after it.
    await compensated_by_both(kube, namespace, participant, tracker, "Compensated", prefix="warm-")
    participant.script("/undo", Reply(200, size=HUGE_BYTES))
    tracker.issues.faults.append("huge")
    assert operator.process is not None
    before = rss_peak_kib(operator.process.pid)
    http, mcp = await compensated_by_both(
        kube, namespace, participant, tracker, "Compensated", prefix="huge-", mcp_phase="Halted"
    )
    grown_mib = (rss_peak_kib(operator.process.pid) - before) / 1024
    print(f"\noperator peak RSS grew by {grown_mib:.1f} MiB for two {HUGE_BYTES >> 20} MiB answers")
    print(f"HTTP: {ended(http)} {http['status'].get('outputOmitted')}\nMCP:  {ended(mcp)} {attempt_errors(mcp)}")
    assert grown_mib < 16
    assert ended(http) == ("Compensated", None)
    assert ended(mcp) == ("Failed", "PermanentFailure")
    assert attempt_errors(mcp) == [
        "tool 'close_issue' answered more than 1048576 bytes: the rest was not read (connection closed), so its "
        "result is unknown and the effect may have happened"
    ]


async def test_a_json_rpc_refusal_halts_as_a_permanent_refusal_does_saying_the_tool_s_own_words(
    kube: Kube, namespace: str, participant: Participant, tracker: Tracker, operator: OperatorProcess
) -> None:
    """A server that refuses with a JSON-RPC error (as mcp-server-kubernetes does) instead of
    isError: halted within the retry policy, never waited out as an outage, its message on the
    entry, its Events and `undolog show`."""
    participant.script("/undo", Reply(422, body={"error": "locked"}))
    tracker.issues.faults.append("refused")
    http, mcp = await compensated_by_both(kube, namespace, participant, tracker, "Halted", lambda _: None)
    assert ended(http) == ended(mcp) == ("Failed", "PermanentFailure")
    assert len(attempt_errors(mcp)) == 1  # not retried
    said = "MCP error -32602 from tool 'close_issue': issue #1 is locked: AlreadyExists"
    assert mcp["status"]["lastError"].startswith(said)
    shown = await Inspector(kube).show(namespace, "mcp")
    assert any(said in (e.status.last_error or "") for e in shown.entries)
    assert any(said in e.message for e in shown.events)
    assert tracker.issues.closes == []


async def test_a_json_rpc_internal_error_is_asked_again_under_the_same_key(
    kube: Kube, namespace: str, participant: Participant, tracker: Tracker, operator: OperatorProcess
) -> None:
    participant.script("/undo", Reply(503))
    tracker.issues.faults.append("internal")
    http, mcp = await compensated_by_both(kube, namespace, participant, tracker, "Compensated", lambda _: None)
    assert ended(http) == ended(mcp) == ("Compensated", None)  # both retried: a 503, an internal error
    assert attempt_errors(mcp) == [
        "MCP error -32603 from tool 'close_issue': the tracker's database is restarting",
        None,
    ]
    assert [close.meta_key for close in tracker.issues.closes] == [f"undo-{mcp['spec']['undoId']}"]
