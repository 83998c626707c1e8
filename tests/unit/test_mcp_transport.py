"""What an MCP tool's answer is to the operator: its output, or a failure the retry rules classify."""

from __future__ import annotations

import mcp_types as types

from undolog.calls.mcp import answered
from undolog.decisions.retry import Verdict, classify


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
