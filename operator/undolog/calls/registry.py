"""The function registry: a Call's function and version resolved to a target.

Only Webhooks in the saga's own namespace are looked up; a `service` target names a Service in
that namespace too (unless the operator is told otherwise), and a Secret sent as headers must
opt in with the label undolog.io/webhook-headers=true. So creating a Webhook lets its author
choose where calls go (within the egress policy), not read other namespaces' services or any
Secret of the namespace. What cannot be resolved is a permanent failure: nothing is sent.
"""

from __future__ import annotations

from dataclasses import dataclass

from undolog import errors
from undolog.api import Call, EntryReason, Webhook, WebhookVersion
from undolog.calls import signing
from undolog.calls.protocol import secret_headers
from undolog.calls.transport import Target
from undolog.calls.webhook_cache import WebhookCache
from undolog.conventions import HEADERS_SECRET_LABEL
from undolog.decisions.outage import outage_budget
from undolog.errors import CallNotPossible
from undolog.ledger import Ledger


def choose_version(webhook: Webhook, call: Call) -> WebhookVersion:
    version = webhook.spec.version(call.version)
    if version is None:
        known = ", ".join(v.name for v in webhook.spec.versions)
        raise CallNotPossible(
            EntryReason.FUNCTION_NOT_FOUND,
            f"Webhook {webhook.reference} has no version {call.version!r} (it has {known}); "
            "fix the Call's version or add it to the Webhook's spec.versions",
        )
    return version


def version_url(webhook: Webhook, version: WebhookVersion, *, cross_namespace: bool) -> str:
    if version.url:
        return version.url
    service = version.service
    assert service is not None  # the CRD requires exactly one of url and service
    namespace = service.namespace or webhook.metadata.namespace
    if namespace != webhook.metadata.namespace and not cross_namespace:
        raise CallNotPossible(
            EntryReason.TARGET_REFUSED,
            f"Webhook {webhook.reference} version {version.name} names Service {namespace}/{service.name}, "
            f"outside the Webhook's namespace; the operator calls Services of another namespace only with "
            "--allow-cross-namespace-services",
        )
    return f"{service.scheme}://{service.name}.{namespace}.svc:{service.port}{service.path}"


@dataclass
class Registry:
    ledger: Ledger
    cross_namespace_services: bool = False
    cache: WebhookCache | None = None  # Webhooks from a watch: no read per call

    async def target(self, namespace: str, call: Call, *, with_headers: bool = True, fresh: bool = False) -> Target:
        """The target of `call` from a saga in `namespace`; CallNotPossible when there is none.
        Without `with_headers` no Secret is read (to show where a call would go). The cache is
        used unless `fresh`; what it lacks is read from the API before anything is refused."""
        webhook = None if fresh or self.cache is None else self.cache.get(namespace, call.function)
        if webhook is None:
            try:
                webhook = await self.ledger.webhook(namespace, call.function)
            except errors.NotFound:
                raise CallNotPossible(
                    EntryReason.FUNCTION_NOT_FOUND,
                    f"no Webhook {call.function!r} in namespace {namespace}; register the function as a Webhook there",
                ) from None
        return await self._target(webhook, call, with_headers=with_headers)

    async def changed(self, namespace: str, call: Call, used: Target) -> Target | None:
        """After a call failed: the target the API's Webhook gives now, when it differs from the
        one used (a Webhook fixed while the cache had not heard yet); None otherwise."""
        if self.cache is None:
            return None
        try:
            now = await self.target(namespace, call, fresh=True)
        except CallNotPossible:
            return None
        return now if now != used else None

    async def _target(self, webhook: Webhook, call: Call, *, with_headers: bool) -> Target:
        version = choose_version(webhook, call)
        url = version_url(webhook, version, cross_namespace=self.cross_namespace_services)
        return Target(
            url=url,
            timeout_seconds=float(call.timeout_seconds or webhook.spec.timeout_seconds),
            ca_bundle=version.ca_bundle,
            participant=webhook.reference,
            limits=webhook.spec.limits,
            outage_budget_seconds=outage_budget(webhook.spec.outage_budget_seconds),
            headers=await self._headers(webhook) if with_headers else {},
            signing_keys=await self._signing_keys(webhook) if with_headers else (),
            client_certificate=await self._client_certificate(webhook) if with_headers else None,
            tool=version.mcp.tool if version.mcp else None,
        )

    async def _client_certificate(self, webhook: Webhook) -> tuple[bytes, bytes] | None:
        if webhook.spec.client_certificate is None:
            return None
        secret = webhook.spec.client_certificate.secret_ref.name
        data = await self._secret(webhook, secret, CLIENT_CERTIFICATE)
        missing = [key for key in ("tls.crt", "tls.key") if not data.get(key)]
        if missing:
            raise CallNotPossible(
                EntryReason.CLIENT_CERTIFICATE_INVALID,
                f"Secret {webhook.metadata.namespace}/{secret} (spec.clientCertificate) has no {' or '.join(missing)}: "
                "it needs tls.crt and tls.key (kubectl create secret tls)",
            )
        return data["tls.crt"], data["tls.key"]

    async def _headers(self, webhook: Webhook) -> dict[str, str]:
        if webhook.spec.headers_from is None:
            return {}
        secret = webhook.spec.headers_from.secret_ref.name
        data = await self._secret(webhook, secret, HEADERS)
        return secret_headers(f"{webhook.metadata.namespace}/{secret}", data)

    async def _signing_keys(self, webhook: Webhook) -> tuple[str, ...]:
        if webhook.spec.signing is None:
            return ()
        secret = webhook.spec.signing.secret_ref.name
        data = await self._secret(webhook, secret, SIGNING)
        keys = []
        for name in sorted(data):
            value = data[name].decode(errors="replace").strip()
            problem = signing.key_problem(value)
            if problem:
                raise CallNotPossible(
                    EntryReason.SIGNING_SECRET_INVALID,
                    f"Secret {webhook.metadata.namespace}/{secret} (spec.signing) key {name!r} {problem}",
                )
            keys.append(value)
        if not keys:
            raise CallNotPossible(
                EntryReason.SIGNING_SECRET_INVALID,
                f"Secret {webhook.metadata.namespace}/{secret} (spec.signing) holds no key: add one (whsec_...)",
            )
        return tuple(keys)

    async def _secret(self, webhook: Webhook, secret: str, use: SecretUse) -> dict[str, bytes]:
        """A Secret the Webhook names, once it opted in; CallNotPossible otherwise."""
        namespace = webhook.metadata.namespace
        try:
            labels, data = await self.ledger.kube.secret(namespace, secret)
        except errors.NotFound:
            raise CallNotPossible(
                use.not_found,
                f"Webhook {webhook.reference} names {use.field} {secret!r}, which does not exist",
            ) from None
        if labels.get(HEADERS_SECRET_LABEL) != "true":
            raise CallNotPossible(
                use.not_opted_in,
                f"Webhook {webhook.reference} names Secret {namespace}/{secret} in {use.field}, which has not "
                f"opted in: label it {HEADERS_SECRET_LABEL}=true to let UndoLog {use.purpose}",
            )
        return data


@dataclass(frozen=True)
class SecretUse:
    """What a Webhook reads a Secret for: the field that names it and the refusals."""

    field: str
    purpose: str
    not_found: EntryReason
    not_opted_in: EntryReason


HEADERS = SecretUse(
    "spec.headersFrom.secretRef",
    "send it as headers",
    EntryReason.HEADERS_SECRET_NOT_FOUND,
    EntryReason.HEADERS_SECRET_NOT_OPTED_IN,
)
CLIENT_CERTIFICATE = SecretUse(
    "spec.clientCertificate.secretRef",
    "present it as its client certificate",
    EntryReason.CLIENT_CERTIFICATE_NOT_FOUND,
    EntryReason.CLIENT_CERTIFICATE_NOT_OPTED_IN,
)
SIGNING = SecretUse(
    "spec.signing.secretRef",
    "sign calls with its keys",
    EntryReason.SIGNING_SECRET_NOT_FOUND,
    EntryReason.SIGNING_SECRET_NOT_OPTED_IN,
)
