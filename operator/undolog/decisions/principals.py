"""Who calls the gateway: the principal a verified token stands for, as the ledger records it
and as policies read it. Pure: the token is verified elsewhere (gateway/authentication.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"
MAX_NAME = 512  # a principal's name as recorded (spec.principal): an issuer URL and a subject fit


@dataclass(frozen=True)
class ServiceAccount:
    namespace: str
    name: str


@dataclass(frozen=True)
class Principal:
    """An issuer's subject (a JWT's `iss` and `sub`), or a ServiceAccount of the cluster."""

    issuer: str
    subject: str
    claims: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)
    service_account: ServiceAccount | None = None
    expires_at: int | None = None  # the token's exp, Unix seconds

    @property
    def name(self) -> str:
        """As Kubernetes names a user: `system:serviceaccount:<namespace>:<name>`, or
        `<issuer>#<subject>` (the apiserver's OIDC authenticator's form)."""
        if self.service_account is not None:
            return f"{SERVICE_ACCOUNT_PREFIX}{self.service_account.namespace}:{self.service_account.name}"
        return f"{self.issuer}#{self.subject}"[:MAX_NAME]

    def readable(self) -> dict[str, Any]:
        """What a policy or a tenancy rule reads of it (CEL's `principal`)."""
        account = self.service_account
        return {
            "name": self.name,
            "issuer": self.issuer,
            "subject": self.subject,
            "claims": dict(self.claims),
            "serviceAccount": {"namespace": account.namespace, "name": account.name} if account else None,
        }


def service_account_of(username: str) -> ServiceAccount | None:
    """The ServiceAccount a Kubernetes username names (`system:serviceaccount:<ns>:<name>`), if it does."""
    if not username.startswith(SERVICE_ACCOUNT_PREFIX):
        return None
    namespace, _, name = username.removeprefix(SERVICE_ACCOUNT_PREFIX).partition(":")
    return ServiceAccount(namespace, name) if namespace and name and ":" not in name else None


def reviewed(user: Mapping[str, Any], issuer: str) -> Principal | None:
    """The principal of a TokenReview's `status.user`; None when it is not a ServiceAccount."""
    username = str(user.get("username") or "")
    account = service_account_of(username)
    if account is None:
        return None
    claims = {"sub": username, "groups": list(user.get("groups") or []), "extra": dict(user.get("extra") or {})}
    return Principal(issuer, username, claims, account)
