"""A namespace per tenant (decisions/tenancy.py) and who a principal is (decisions/principals.py)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.gateway_settings import settings
from undolog.decisions.expressions import ExpressionError
from undolog.decisions.principals import Principal, ServiceAccount, reviewed, service_account_of
from undolog.decisions.tenancy import TenantRefused, Tenants

ISSUER = "https://login.example/"
ALICE = Principal(ISSUER, "alice", {"sub": "alice", "team": "payments"})
BOB = Principal(ISSUER, "bob", {"sub": "bob"})
ROBOT = Principal("kubernetes", "system:serviceaccount:team-b:agent", {}, ServiceAccount("team-b", "agent"))


def tenants(**tenancy: Any) -> Tenants:
    return Tenants(settings(tenancy=tenancy))


def test_by_default_a_service_account_is_its_own_namespace_and_anyone_else_the_gateway_s() -> None:
    plain = tenants()
    assert plain.namespace_of(ROBOT) == "team-b"
    assert plain.namespace_of(ALICE) == "agents"
    assert plain.namespace_of(None) == "agents"  # auth none, or stdio


def test_the_table_wins_then_the_rule_over_the_principal() -> None:
    ruled = tenants(table={f"{ISSUER}#bob": "ops"}, rule="principal.claims.team")
    assert ruled.namespace_of(BOB) == "ops"
    assert ruled.namespace_of(ALICE) == "payments"
    with pytest.raises(TenantRefused, match=r"no namespace for system:serviceaccount:team-b:agent: tenancy.rule"):
        ruled.namespace_of(ROBOT)  # no claim `team`
    upper = tenants(rule="'Payments'")
    with pytest.raises(TenantRefused, match=r"tenancy\.rule gave 'Payments', not a namespace name"):
        upper.namespace_of(ALICE)


def test_a_namespace_not_served_is_refused_naming_those_that_are() -> None:
    served = tenants(namespaces=["team-a"])
    with pytest.raises(TenantRefused, match=r"agent's namespace team-b is not one this gateway serves \(team-a\)"):
        served.namespace_of(ROBOT)
    assert served.namespace_of(ALICE) == "agents"  # the gateway's own is always served


def test_a_rule_that_does_not_compile_is_refused_when_the_configuration_loads() -> None:
    with pytest.raises(ExpressionError, match=r"tenancy.rule 'principal.claims\.' does not compile"):
        tenants(rule="principal.claims.")


def test_a_review_names_a_service_account_or_nobody() -> None:
    account = reviewed({"username": "system:serviceaccount:ns:bot", "groups": ["system:serviceaccounts"]}, "kubernetes")
    assert account is not None
    assert (account.name, account.service_account) == ("system:serviceaccount:ns:bot", ServiceAccount("ns", "bot"))
    assert reviewed({"username": "alice@example.com"}, "kubernetes") is None
    assert service_account_of("system:serviceaccount:ns:a:b") is None
    assert ALICE.name == "https://login.example/#alice"
