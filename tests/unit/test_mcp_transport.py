"""What an MCP tool's answer is to the operator: its output, or a failure the retry rules classify."""

from __future__ import annotations

from collections.abc import Iterator

import mcp_types as types
import pytest

from tests.support.mcp_tracker import Tracker
from undolog.calls.http import HttpTransport
from undolog.calls.mcp import McpTransport, answered, calls_the_tool
from undolog.calls.transport import PreparedCall, Target
from undolog.decisions.egress import EgressPolicy
from undolog.decisions.retry import Verdict, classify
from undolog.errors import NotLeading


def result(*texts: str, structured: dict[str, object] | None = None, error: bool = False) -> types.CallToolResult:
    content: list[types.ContentBlock] = [types.TextContent(type="text", text=text) for text in texts]
    return types.CallToolResult(content=content, structured_content=structured, is_error=error)


def test_structured_content_is_the_output() -> None:
    outcome = answered("close_issue", 200, result("closed", structured={"number": 3}))
    assert (outcome.output, classify(outcome)) == ({"number": 3}, Verdict.SUCCEEDED)


def test_a_lone_text_that_is_a_json_object_is_the_output_of_a_server_without_structured_output() -> None:
    assert answered("t", 200, result('{"number": 3}')).output == {"number": 3}
    plain = answered("t", 200, result("closed #3"))
    assert plain.output is None
    assert plain.omitted is not None
    assert classify(plain) == Verdict.SUCCEEDED


def test_is_error_is_the_participant_refusing_permanent_and_said() -> None:
    outcome = answered("close_issue", 200, result("no issue #9", error=True))
    assert classify(outcome) == Verdict.PERMANENT
    assert outcome.error == "tool 'close_issue' answered isError: no issue #9"


def test_a_failed_call_keeps_what_its_partial_effect_left() -> None:
    outcome = answered("create_issue", 200, result("opened #3, then failed", structured={"number": 3}, error=True))
    assert (classify(outcome), outcome.output) == (Verdict.PERMANENT, {"number": 3})


@pytest.fixture
def served() -> Iterator[Tracker]:
    tracker = Tracker()
    yield tracker
    tracker.stop()


@pytest.mark.parametrize("requests_led", [0, 1])
async def test_a_lease_in_doubt_before_the_tool_is_called_raises_and_calls_nothing(
    served: Tracker, requests_led: int
) -> None:
    """As over HTTP: the Lease in doubt before the tools/call leaves (at the first request, or
    after the handshake's first) is NotLeading, which the driver waits out, not a failed
    attempt recorded on the entry (a make test run showed `NotLeading: ...` as an attempt's
    error, and an isError answer counted as a second attempt)."""
    asked: list[int] = []

    def guard() -> None:
        asked.append(1)
        if len(asked) > 2 * requests_led:  # asked twice per request: on connecting, before writing
            raise NotLeading("the Lease is in doubt")

    served.issues.open("kept open")
    http = HttpTransport(EgressPolicy.build(allow_loopback=True), guard=guard)
    target = Target(served.url, 5.0, tool="close_issue")
    try:
        with pytest.raises(NotLeading):
            await McpTransport(http).send(PreparedCall(target, {"number": 1}, {"Idempotency-Key": "k"}))
    finally:
        await http.close()
    assert len(served.issues.authorizations) == requests_led
    assert (served.issues.closes, served.issues.state(1)) == ([], "open")


async def test_a_lease_in_doubt_once_the_tool_was_called_is_an_attempt_asked_again(served: Tracker) -> None:
    """Once the tools/call has left, the tool may have acted: a refusal of a later request of
    the exchange (the client's tools/list, to check the result's schema) is a failed attempt,
    asked again under the same key, not 'nothing sent'."""
    asked: list[int] = []

    def guard() -> None:
        asked.append(1)
        if len(asked) > 4:  # server/discover and tools/call leave; what follows is refused
            raise NotLeading("the Lease is in doubt")

    served.issues.open("to close")
    http = HttpTransport(EgressPolicy.build(allow_loopback=True), guard=guard)
    target = Target(served.url, 5.0, tool="close_issue")
    try:
        outcome = await McpTransport(http).send(PreparedCall(target, {"number": 1}, {"Idempotency-Key": "k"}))
    finally:
        await http.close()
    assert (outcome.error, classify(outcome)) == ("NotLeading: the Lease is in doubt", Verdict.TRANSIENT)
    assert [close.meta_key for close in served.issues.closes] == ["k"]
    assert calls_the_tool(b'{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"t"}}')
    assert not calls_the_tool(b"")


@pytest.mark.parametrize(
    ("fault", "said", "verdict"),
    [
        ("refused", "MCP error -32602 from tool 'close_issue': issue #1 is locked: AlreadyExists", Verdict.PERMANENT),
        (
            "internal",
            "MCP error -32603 from tool 'close_issue': the tracker's database is restarting",
            Verdict.TRANSIENT,
        ),
    ],
)
async def test_a_json_rpc_error_is_the_tool_s_answer_classified_by_its_code_with_its_message(
    served: Tracker, fault: str, said: str, verdict: Verdict
) -> None:
    """A server that refuses with a JSON-RPC error instead of isError: its code decides (an
    internal error is retried, the rest is the tool's refusal) and its own message is what the
    entry says. Before, the client's task group wrapped it: `MCP: ExceptionGroup: unhandled
    errors in a TaskGroup`, retried as an outage whatever the code."""
    served.issues.open("locked")
    served.issues.faults.append(fault)
    http = HttpTransport(EgressPolicy.build(allow_loopback=True))
    target = Target(served.url, 5.0, tool="close_issue")
    try:
        outcome = await McpTransport(http).send(PreparedCall(target, {"number": 1}, {"Idempotency-Key": "k"}))
    finally:
        await http.close()
    assert (outcome.error, classify(outcome)) == (said, verdict)
    assert served.issues.closes == []
