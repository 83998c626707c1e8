"""A namespace per tenant: which namespace a caller's sagas go to, from who it is (the
gateway's `tenancy`). Its principal in the table; else what the rule (CEL over `principal`)
gives; else a ServiceAccount's own namespace; else the gateway's `namespace`. A caller without
a principal (`auth: none`, stdio) is the gateway's namespace's. Pure: the rule is compiled once."""

from __future__ import annotations

import re

from undolog.api.common import DNS_LABEL
from undolog.api.gateway import GatewayConfig
from undolog.decisions.expressions import Environment, ExpressionError
from undolog.decisions.principals import Principal

_ENV = Environment(("principal",))


class TenantRefused(ValueError):
    """The caller has no namespace this gateway serves: nothing is called."""


class Tenants:
    def __init__(self, config: GatewayConfig) -> None:
        """ExpressionError (a ValueError) naming the rule when it does not compile."""
        self.config, self.tenancy = config, config.tenancy
        rule = self.tenancy.rule
        self.rule = _ENV.compile(rule, f"tenancy.rule {rule!r}") if rule is not None else None

    def namespace_of(self, principal: Principal | None) -> str:
        """The caller's namespace; TenantRefused saying why it has none here."""
        namespace = self._chosen(principal)
        allowed = self.tenancy.namespaces
        if allowed and namespace not in allowed and namespace != self.config.namespace:
            who = principal.name if principal else "the caller"
            raise TenantRefused(f"{who}'s namespace {namespace} is not one this gateway serves ({', '.join(allowed)})")
        return namespace

    def _chosen(self, principal: Principal | None) -> str:
        if principal is None:
            return self.config.namespace
        if principal.name in self.tenancy.table:
            return self.tenancy.table[principal.name]
        if self.rule is not None:
            return self._ruled(principal)
        if principal.service_account is not None:
            return principal.service_account.namespace
        return self.config.namespace

    def _ruled(self, principal: Principal) -> str:
        try:
            value = _ENV.evaluate(self.rule, {"principal": principal.readable()}, "tenancy.rule")
        except ExpressionError as error:
            raise TenantRefused(f"no namespace for {principal.name}: {error}") from None
        if not isinstance(value, str) or not re.fullmatch(DNS_LABEL, value):
            raise TenantRefused(f"no namespace for {principal.name}: tenancy.rule gave {value!r}, not a namespace name")
        return value
