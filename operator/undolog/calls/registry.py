"""The function registry: a Call's function and version resolved to an HTTP target.

Only Webhooks in the saga's own namespace are looked up, so who may create Webhooks (RBAC)
decides where the operator calls. An unregistered function or version is a permanent
failure, FunctionNotFound, and nothing is sent.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from undolog.api.common import Call
from undolog.api.webhook import Webhook, WebhookVersion
from undolog.kube import Kube, is_not_found


class CallNotPossible(Exception):
    """The call cannot be made at all; `reason` is the CamelCase reason recorded."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class Target:
    url: str
    timeout_seconds: float
    ca_bundle: str | None = None
    # Secret header values: never logged, never copied to status or events.
    headers: dict[str, str] = field(default_factory=dict, repr=False)


def version_url(version: WebhookVersion) -> str:
    if version.url:
        return version.url
    service = version.service
    assert service is not None  # the CRD requires exactly one of url and service
    return f"{service.scheme}://{service.name}.{service.namespace}.svc:{service.port}{service.path}"


def choose_version(webhook: Webhook, call: Call, namespace: str) -> WebhookVersion:
    version = webhook.spec.version(call.version)
    if version is None:
        known = ", ".join(v.name for v in webhook.spec.versions)
        raise CallNotPossible(
            "FunctionNotFound",
            f"Webhook {namespace}/{call.function} has no version {call.version!r} (it has {known}); "
            "fix the Call's version or add it to the Webhook's spec.versions",
        )
    return version


async def resolve(kube: Kube, namespace: str, call: Call) -> Target:
    try:
        body = await kube.get("webhooks", namespace, call.function)
    except Exception as error:
        if is_not_found(error):
            raise CallNotPossible(
                "FunctionNotFound",
                f"no Webhook {call.function!r} in namespace {namespace}; register the function as a Webhook there",
            ) from error
        raise
    webhook = Webhook.model_validate(body)
    version = choose_version(webhook, call, namespace)
    headers: dict[str, str] = {}
    if webhook.spec.headers_from is not None:
        secret = webhook.spec.headers_from.secret_ref.name
        try:
            headers = await kube.secret_data(namespace, secret)
        except Exception as error:
            if is_not_found(error):
                raise CallNotPossible(
                    "HeadersSecretNotFound",
                    f"Webhook {namespace}/{call.function} names spec.headersFrom.secretRef {secret!r}, "
                    "which does not exist",
                ) from error
            raise
    return Target(
        url=version_url(version),
        timeout_seconds=float(call.timeout_seconds or webhook.spec.timeout_seconds),
        ca_bundle=version.ca_bundle,
        headers=headers,
    )
