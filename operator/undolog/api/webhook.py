"""Webhook: the function registry, mapping a function name and version to a target: an HTTP
endpoint the call's body is POSTed to, or a tool of an MCP server."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import ClassVar

from pydantic import Field

from undolog.api.common import DNS_LABEL, DNS_SUBDOMAIN, Model, Plural, Resource


class ServiceReference(Model):
    """An in-cluster Service to call instead of a URL."""

    namespace: str | None = Field(
        default=None,
        max_length=63,
        pattern=DNS_LABEL,
        description=(
            "Namespace of the Service; the Webhook's own when unset. Another namespace is called only if "
            "the operator allows it (--allow-cross-namespace-services)."
        ),
    )
    name: str = Field(max_length=63, pattern=DNS_LABEL, description="Name of the Service.")
    port: int = Field(default=443, ge=1, le=65535, description="Service port.")
    path: str = Field(default="/", max_length=1024, pattern=r"^/", description="Request path.")
    scheme: str = Field(default="https", pattern=r"^https?$", description="http or https.")


class McpTool(Model):
    """The version is a tool of the MCP server at its url or service (streamable HTTP)."""

    tool: str = Field(
        max_length=128,
        pattern=r"^[A-Za-z0-9_.-]+$",
        description="The tool's name: each call is a tools/call with the Call's args as its arguments.",
    )


class WebhookVersion(Model):
    """One version of the function and where to call it."""

    name: str = Field(max_length=63, pattern=DNS_LABEL, description="Version name, e.g. v1.")
    url: str | None = Field(
        default=None, max_length=2048, pattern=r"^https?://", description="Absolute http or https URL."
    )
    service: ServiceReference | None = Field(default=None, description="In-cluster Service target.")
    ca_bundle: str | None = Field(
        default=None,
        max_length=65536,
        description="Base64 PEM CA bundle that verifies an https target; the system roots otherwise.",
    )
    mcp: McpTool | None = Field(
        default=None,
        description=(
            "Call a tool of the MCP server at url (or service) instead of POSTing the args: the Idempotency-Key "
            "goes in the request's _meta (io.undolog/idempotency-key) and as the header."
        ),
    )

    model_config = Model.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.url) != has(self.service)",
                    "messageExpression": ("'version \"' + self.name + '\" needs exactly one of url or service'"),
                },
                {
                    # As Kubernetes refuses them in its own webhooks' URLs: credentials in the URL would
                    # be shown wherever the target is (plans, errors, the dashboard).
                    "rule": "!has(self.url) || !self.url.matches('^[a-zA-Z][a-zA-Z0-9+.-]*://[^/?#]*@')",
                    "messageExpression": (
                        "'version \"' + self.name + '\": url must not carry credentials (user:password@): "
                        "send them as headers from a Secret (spec.headersFrom)'"
                    ),
                },
            ]
        }
    }


class SecretReference(Model):
    """A Secret in the Webhook's namespace."""

    name: str = Field(max_length=253, pattern=DNS_SUBDOMAIN, description="Secret name.")


class HeadersFrom(Model):
    """Where extra request headers come from."""

    secret_ref: SecretReference = Field(
        description=(
            "Each key of this Secret is sent as a header; never logged or copied to status. The Secret must "
            "opt in with the label undolog.io/webhook-headers=true."
        )
    )


class Signing(Model):
    """How calls are signed (Standard Webhooks: webhook-id, webhook-timestamp, webhook-signature)."""

    secret_ref: SecretReference = Field(
        description=(
            "Each key of this Secret holds one signing secret (whsec_ followed by base64, as Standard Webhooks "
            "libraries generate): every call carries a v1 HMAC-SHA256 signature per key, in key order, so a "
            "rotation adds the new key, waits for participants to accept it, then removes the old one. Never "
            "logged or copied to status. The Secret must opt in with the label undolog.io/webhook-headers=true."
        )
    )


class ClientCertificate(Model):
    """The certificate the operator presents to a participant that asks for one (mTLS)."""

    secret_ref: SecretReference = Field(
        description=(
            "A Secret holding tls.crt (PEM, the certificate and any intermediates) and tls.key (its PEM key), as "
            "kubernetes.io/tls Secrets and cert-manager's Certificates hold them. Never logged or copied to "
            "status. The Secret must opt in with the label undolog.io/webhook-headers=true."
        )
    )


class Limits(Model):
    """The pace a participant can take, held across every saga of the operator."""

    calls_per_second: float | None = Field(
        default=None, ge=0.01, le=100000, description="Calls started per second, on average; unlimited if unset."
    )
    burst: int = Field(
        default=1,
        ge=1,
        le=100000,
        description="Calls that may start at once after a quiet moment (with callsPerSecond).",
    )
    in_flight: int | None = Field(
        default=None, ge=1, le=10000, description="Calls under way at once; 32 if unset (the transport's own bound)."
    )


class WebhookSpec(Model):
    """Versions of one function and how to call them."""

    versions: list[WebhookVersion] = Field(
        min_length=1,
        max_length=20,
        description="The callable versions; a Call picks one by its version field.",
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.all(v, self.filter(w, w.name == v.name).size() == 1)",
                    "message": "spec.versions[].name must be unique",
                }
            ]
        },
    )
    timeout_seconds: int = Field(default=10, ge=1, le=300, description="Per-attempt timeout.")
    headers_from: HeadersFrom | None = Field(default=None, description="Extra headers from a Secret.")
    limits: Limits | None = Field(
        default=None,
        description=(
            "Calls per second (with a burst) and calls in flight to this participant. Each replica of the operator "
            "takes the share of the shards it holds. A call waiting for its turn holds no saga slot."
        ),
    )
    outage_budget_seconds: int | None = Field(
        default=None,
        ge=1,
        le=7 * 24 * 3600,
        description=(
            "How long a call waits for a participant that does not answer (refused or reset connections, DNS, TLS, "
            "timeouts, 502, 503, 504) before its saga halts with ParticipantUnavailable; no retry is spent meanwhile. "
            "3600 if unset."
        ),
    )
    client_certificate: ClientCertificate | None = Field(
        default=None, description="Present this client certificate on https calls (mTLS); none if unset."
    )
    signing: Signing | None = Field(
        default=None, description="Sign every call with keys from a Secret; unsigned (id and timestamp only) if unset."
    )

    def version(self, name: str) -> WebhookVersion | None:
        """The version a Call names, if registered."""
        return next((v for v in self.versions if v.name == name), None)


class ParticipantState(StrEnum):
    AVAILABLE = "Available"
    UNAVAILABLE = "Unavailable"


class WebhookStatus(Model):
    """Whether the participant answers, as the last operator replica to see it change says."""

    participant: ParticipantState | None = Field(
        default=None, description="Unavailable while its breaker is open: calls wait for it (spec.outageBudgetSeconds)."
    )
    since: datetime | None = Field(default=None, description="When it became so.")
    message: str | None = Field(default=None, max_length=1024, description="What the last unanswered call met.")


class Webhook(Resource):
    """A Webhook object as read from the API."""

    plural: ClassVar[Plural] = "webhooks"

    kind: str = "Webhook"
    spec: WebhookSpec
    status: WebhookStatus = Field(default_factory=WebhookStatus)
