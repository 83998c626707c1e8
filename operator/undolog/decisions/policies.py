"""The gateway's policies: rules over who calls, the tool and its arguments (CEL), asked in
order, the first that holds deciding allow, deny or confirm; none holding leaves the call to
the mapping. A rule that cannot be evaluated refuses the call (it could have been a deny).
Which tools a caller is shown: those no rule would refuse whatever the arguments. Pure: the
rules are compiled once, when the configuration loads."""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import Any

from undolog.api.gateway import GatewayConfig, PolicyAction
from undolog.decisions.expressions import Environment, ExpressionError
from undolog.decisions.principals import Principal
from undolog.decisions.tool_calls import Refuse, Register, ToolDecision

_ENV = Environment(("principal", "tool", "args"))
_READS_ARGS = re.compile(r"(?<![\w.])args\b")


@dataclass(frozen=True)
class Rule:
    name: str
    action: PolicyAction
    program: Any
    reads_args: bool


@dataclass(frozen=True)
class Ruled:
    """What the policies decided of a call: the rule that held (None: none did) and its action;
    `refusal`: why the call is refused when a rule could not be evaluated."""

    rule: str | None
    action: PolicyAction | None
    refusal: str | None = None


class Policies:
    def __init__(self, config: GatewayConfig) -> None:
        """ExpressionError naming the policy whose rule does not compile."""
        self.rules = [
            Rule(p.name, p.action, _ENV.compile(p.when, f"policies.{p.name}.when"), bool(_READS_ARGS.search(p.when)))
            for p in config.policies
        ]

    def ruled(self, principal: Principal | None, tool: str, args: dict[str, Any]) -> Ruled:
        return _first(self.rules, principal, tool, args)

    def shown(self, principal: Principal | None, tool: str) -> bool:
        """Whether the caller is shown the tool: no rule, asked in order up to the first that
        reads the arguments, refuses it."""
        leading = list(itertools.takewhile(lambda rule: not rule.reads_args, self.rules))
        return _first(leading, principal, tool, {}).action != PolicyAction.DENY


def _first(rules: list[Rule], principal: Principal | None, tool: str, args: dict[str, Any]) -> Ruled:
    """The first rule that holds; one that cannot be evaluated refuses."""
    variables = {"principal": principal.readable() if principal else None, "tool": tool, "args": args}
    for rule in rules:
        try:
            held = _ENV.evaluate(rule.program, variables, f"policies.{rule.name}.when")
        except ExpressionError as error:
            return Ruled(rule.name, PolicyAction.DENY, f"{error}: refused, as its rule could have been a deny")
        if held is True:
            return Ruled(rule.name, rule.action)
    return Ruled(None, None)


def with_policy(decision: ToolDecision, ruled: Ruled, tool: str) -> ToolDecision:
    """The mapping's decision as the policies leave it: denied (naming the rule), asked first
    (a step only: a read records nothing an answer could be kept on), or as it was."""
    if ruled.action == PolicyAction.DENY:
        return Refuse(f"tool {tool} was not called: {ruled.refusal or f'denied by policy {ruled.rule}'}")
    if ruled.action == PolicyAction.CONFIRM and isinstance(decision, Register):
        return Register(decision.rule, confirm=True, asked_by=ruled.rule)
    return decision
