"""The gateway's pure decisions: what happens to a tool call, and the compensation it registers;
and its configuration file's refusals."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from undolog.api.common import MAX_ARGS
from undolog.api.gateway import GatewayConfig, ToolRule
from undolog.decisions.arguments import resolve
from undolog.decisions.expressions import ExpressionError
from undolog.decisions.tool_calls import (
    PassThrough,
    Refuse,
    Register,
    compensation_call,
    decide,
    expression_problems,
)
from undolog.decisions.undo_expressions import COMPUTED, computed, expressions_in

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)


def config(**overrides: Any) -> GatewayConfig:
    return GatewayConfig.model_validate(
        {
            "namespace": "agents",
            "auth": "none",
            "upstreams": {"tracker": {"url": "http://127.0.0.1:1/mcp"}, "files": {"command": ["files-server"]}},
            "tools": {
                "tracker.create_issue": {
                    "compensation": {"tool": "tracker.close_issue", "args": {"number": "${output.number}"}}
                },
                "tracker.search": {"readOnly": True},
                "files.write": {"compensation": {"function": "restore-file", "args": {"path": "${args.path}"}}},
            },
            **overrides,
        }
    )


def test_mapped_tools_are_registered_and_read_only_ones_pass() -> None:
    gateway = config()
    assert decide(gateway, "tracker.create_issue", read_only_hint=False) == Register(
        gateway.tools["tracker.create_issue"]
    )
    assert decide(gateway, "tracker.search", read_only_hint=False) == PassThrough()
    assert decide(gateway, "tracker.list_issues", read_only_hint=True) == PassThrough()


def test_an_unmapped_tool_is_refused_naming_it_and_how_to_map_it_unless_the_policy_passes_it() -> None:
    refused = decide(config(), "tracker.label_issue", read_only_hint=False)
    assert isinstance(refused, Refuse)
    assert "tracker.label_issue is not mapped" in refused.message
    assert "tools.tracker.label_issue" in refused.message
    assert "readOnly: true" in refused.message
    assert decide(config(unmapped="pass"), "tracker.label_issue", read_only_hint=False) == Register(None)


def test_a_mapping_wins_over_the_server_s_read_only_hint() -> None:
    # A server that calls create_issue read-only is not believed over the configuration.
    gateway = config()
    assert isinstance(decide(gateway, "tracker.create_issue", read_only_hint=True), Register)


def test_the_compensation_takes_the_arguments_now_and_the_output_when_compensated() -> None:
    gateway = config()
    call, _ = compensation_call(gateway.tools["tracker.create_issue"], {"args": {"title": "x"}}, "create-issue-1")
    assert (call.function, call.args) == ("tracker.close-issue", {"number": "${steps.create-issue-1.output.number}"})
    # The operator fills it in from the step's recorded output, as for orchestrated steps.
    assert resolve(call.args, {"create-issue-1": {"number": 7}}) == {"number": 7}
    files, _ = compensation_call(gateway.tools["files.write"], {"args": {"path": "/a", "data": "..."}}, "write-2")
    assert (files.function, files.args) == ("restore-file", {"path": "/a"})


def test_a_reference_inside_text_is_spliced_and_a_missing_argument_is_named() -> None:
    rule = ToolRule.model_validate(
        {"compensation": {"function": "undo", "args": {"note": "undo ${args.repo}#${output.n}", "n": "${args.n}"}}}
    )
    call, _ = compensation_call(rule, {"args": {"repo": "a/b", "n": [1, 2]}}, "s-1")
    assert call.args == {"note": "undo a/b#${steps.s-1.output.n}", "n": [1, 2]}
    with pytest.raises(ExpressionError, match='Key not found in map : "repo"'):
        compensation_call(rule, {"args": {"n": 1}}, "s-1")
    wrong = ToolRule.model_validate({"compensation": {"function": "undo", "args": {"x": "${steps.a.output}"}}})
    with pytest.raises(ExpressionError, match=r"undeclared reference to 'steps\.a\.output'"):
        compensation_call(wrong, {"args": {}}, "s-1")


def test_a_projection_of_the_output_is_computed_once_the_result_is_back() -> None:
    """The undo of "create these entities" needs the names the call created, a list projected
    out of its result, under another key than the call took."""
    rule = ToolRule.model_validate(
        {"compensation": {"function": "undo", "args": {"entityNames": "${output.entities.map(e, e.name)}"}}}
    )
    call, filled = compensation_call(rule, {"args": {"entities": [{"name": "a"}]}}, "create-entities-1")
    assert call.args == {"entityNames": "${steps.create-entities-1.output.undolog_undo.e0}"}
    values, failed = computed(filled.deferred, {"output": {"entities": [{"name": "a"}, {"name": "b"}]}})
    assert (values, failed) == ({"e0": ["a", "b"]}, [])
    assert resolve(call.args, {"create-entities-1": {COMPUTED: values}}) == {"entityNames": ["a", "b"]}


def test_an_expression_with_braces_of_its_own_ends_where_they_balance() -> None:
    """CEL's map literals and strings hold braces: the undo of "add these observations" renames
    the keys of each item it added."""
    template = {
        "deletions": "${output.results.map(r, {'entityName': r.entityName, 'observations': r.added})}",
        "note": "undo of ${args.title} ('}' and \"{\" are text) by ${'{' + args.who + '}'}",
    }
    rule = ToolRule.model_validate({"compensation": {"function": "undo", "args": template}})
    call, filled = compensation_call(rule, {"args": {"title": "t", "who": "ada"}}, "add-1")
    assert call.args["note"] == "undo of t ('}' and \"{\" are text) by {ada}"
    output = {"results": [{"entityName": "a", "added": ["x"]}]}
    assert computed(filled.deferred, {"output": output}) == ({"e0": [{"entityName": "a", "observations": ["x"]}]}, [])
    assert expressions_in("${unclosed {") == []


def test_an_expression_that_does_not_compile_or_reads_what_it_has_not_is_refused_at_load() -> None:
    broken = config(
        tools={
            "tracker.create_issue": {"compensation": {"tool": "tracker.close_issue", "args": {"n": "${output.}"}}},
            "files.write": {"compensation": {"function": "restore", "args": {"content": "${before.text}"}}},
            "tracker.label_issue": {"kubernetes": {"resource": "cm", "name": "${output.name}"}},
        }
    )
    problems = expression_problems(broken)
    assert problems[0].startswith("tools.tracker.create_issue.compensation.args: ${output.} does not compile:")
    assert problems[1] == "tools.files.write.compensation.args: ${before.text} reads before, which it has not here"
    assert problems[2] == "tools.tracker.label_issue.kubernetes: ${output.name} reads output, which it has not here"


IDENTIFIER = st.from_regex(r"[a-z_][a-z0-9_]{0,7}", fullmatch=True).filter(lambda k: k not in {"in", "as", "null"})


@given(st.dictionaries(IDENTIFIER, INT64, max_size=MAX_ARGS))
def test_every_argument_reference_takes_its_value(args: dict[str, int]) -> None:
    rule = ToolRule.model_validate({"compensation": {"function": "undo", "args": {k: f"${{args.{k}}}" for k in args}}})
    assert compensation_call(rule, {"args": args}, "s-1")[0].args == args


def test_an_argument_the_ledger_cannot_carry_is_refused_before_the_step_is_registered() -> None:
    rule = ToolRule.model_validate({"compensation": {"function": "undo", "args": {"id": "${args.id}"}}})
    with pytest.raises(ValueError, match=r"\$\{args.id\} cannot be evaluated: .*out of range"):
        compensation_call(rule, {"args": {"id": 2**64}}, "s-1")


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"tools": {"tracker.create_issue": {"compensaton": {}}}}, "compensaton"),
        (
            {"tools": {"tracker.create_issue": {}}},
            r"either readOnly: true, has a compensation \(or kubernetes\), or confirm: true",
        ),
        (
            {"tools": {"tracker.create_issue": {"kubernetes": {"resource": "cm", "name": "x"}, "confirm": True}}},
            "confirm: true is for those that cannot",
        ),
        (
            {
                "tools": {
                    "tracker.create_issue": {
                        "kubernetes": {"resource": "cm", "name": "x"},
                        "compensation": {"function": "undo"},
                    }
                }
            },
            "kubernetes is the tool's whole undo",
        ),
        ({"tools": {"github.create_issue": {"readOnly": True}}}, "names no upstream"),
        ({"upstreams": {"tracker": {}}}, "exactly one of url or command"),
        ({"tools": {"create_issue": {"readOnly": True}}}, "<upstream>.<tool>"),
    ],
)
def test_a_configuration_that_is_wrong_is_refused_naming_the_field(change: dict[str, Any], said: str) -> None:
    with pytest.raises(ValidationError, match=said):
        config(**change)
