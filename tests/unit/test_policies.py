"""The gateway's policies (decisions/policies.py): the first rule that holds decides; a rule
that cannot be evaluated refuses; a caller is shown what no rule refuses whatever the arguments."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.gateway_settings import settings
from undolog.api.gateway import PolicyAction, ToolRule
from undolog.decisions.expressions import ExpressionError
from undolog.decisions.policies import Policies, Ruled, with_policy
from undolog.decisions.principals import Principal, ServiceAccount
from undolog.decisions.tool_calls import PassThrough, Refuse, Register

ISSUER = "https://login.example/"
TEAM_A = Principal(ISSUER, "team-a", {"sub": "team-a", "team": "a"})
TEAM_B = Principal("kubernetes", "system:serviceaccount:team-b:agent", {}, ServiceAccount("team-b", "agent"))
TEAM_B_RULE = "principal.serviceAccount != null && principal.serviceAccount.namespace == 'team-b'"
RULES = [
    {"name": "b-never-labels", "when": f"{TEAM_B_RULE} && tool == 'tracker.label_issue'", "action": "deny"},
    {"name": "b-asks-to-close", "when": f"{TEAM_B_RULE} && tool == 'tracker.close_issue'", "action": "confirm"},
    {"name": "no-prod-titles", "when": "has(args.title) && args.title.startsWith('prod')", "action": "deny"},
]
DENY, CONFIRM = PolicyAction.DENY, PolicyAction.CONFIRM


def policies(rules: list[dict[str, Any]]) -> Policies:
    return Policies(settings(policies=rules))


def test_the_first_rule_that_holds_decides_and_names_itself() -> None:
    asked = policies(RULES)
    assert asked.ruled(TEAM_B, "tracker.label_issue", {"number": 1}) == Ruled("b-never-labels", DENY)
    assert asked.ruled(TEAM_B, "tracker.close_issue", {"number": 1}) == Ruled("b-asks-to-close", CONFIRM)
    assert asked.ruled(TEAM_A, "tracker.create_issue", {"title": "prod outage"}) == Ruled("no-prod-titles", DENY)
    assert asked.ruled(TEAM_A, "tracker.label_issue", {"number": 1}) == Ruled(None, None)


def test_a_rule_that_cannot_be_evaluated_refuses_the_call_naming_itself() -> None:
    careless = {"name": "b-never-labels", "when": "principal.serviceAccount.namespace == 'team-b'", "action": "deny"}
    ruled = policies([careless]).ruled(TEAM_A, "tracker.label_issue", {})  # no serviceAccount: null.namespace
    assert (ruled.rule, ruled.action) == ("b-never-labels", DENY)
    assert ruled.refusal is not None
    assert ruled.refusal.startswith("policies.b-never-labels.when cannot be evaluated")


def test_a_caller_is_shown_what_no_rule_refuses_whatever_the_arguments() -> None:
    guarded = policies([RULES[0], RULES[2]])
    assert not guarded.shown(TEAM_B, "tracker.label_issue")
    assert guarded.shown(TEAM_A, "tracker.label_issue")
    assert guarded.shown(TEAM_B, "tracker.create_issue")  # the args rule cannot say before the call


def test_the_mapping_s_decision_denied_or_asked_first() -> None:
    mapped = Register(ToolRule.model_validate({"compensation": {"function": "undo"}}))
    assert with_policy(mapped, Ruled("b-asks-to-close", CONFIRM), "t.x") == Register(
        mapped.rule, True, "b-asks-to-close"
    )
    denied = with_policy(PassThrough(), Ruled("b-never-labels", DENY), "t.x")
    assert denied == Refuse("tool t.x was not called: denied by policy b-never-labels")
    assert with_policy(PassThrough(), Ruled("x", CONFIRM), "t.x") == PassThrough()
    assert with_policy(mapped, Ruled(None, None), "t.x") is mapped


def test_a_rule_that_does_not_compile_is_refused_at_load_naming_it() -> None:
    with pytest.raises(ExpressionError, match=r"policies\.broken\.when does not compile"):
        policies([{"name": "broken", "when": "tool ==", "action": "deny"}])
