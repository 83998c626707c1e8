"""Calls a participant can trust. Signed (Standard Webhooks): a participant verifying with the
`standardwebhooks` library accepts every call the operator makes, forward and compensation,
during a key rotation, and refuses a changed body, a wrong key and an old timestamp on a call
the operator really sent. mTLS: the operator presents the client certificate its Webhook names."""

from __future__ import annotations

import base64
import os
import ssl
import time
from pathlib import Path
from typing import Any

import pytest
from standardwebhooks import Webhook as Verifier
from standardwebhooks.webhooks import WebhookVerificationError

from tests.cluster.test_compensation import abort, external_saga
from tests.conftest import Cluster
from tests.support.manifests import call, saga, step, webhook
from tests.support.operator_process import OperatorProcess
from tests.support.participants import HttpsParticipant, Participant, Received, Reply
from tests.support.waiting import saga_phase
from undolog.kube import Kube

pytestmark = pytest.mark.cluster


def new_secret() -> str:
    return "whsec_" + base64.b64encode(os.urandom(24)).decode()


def verdict(verifier: Verifier, request: Received) -> str | None:
    """None when the request verifies, else why not."""
    try:
        verifier.verify(request.raw, request.headers)
    except WebhookVerificationError as error:
        return str(error)
    return None


async def signed_webhooks(
    kube: Kube, namespace: str, participant: Participant, keys: dict[str, str], *names: str
) -> None:
    secret = {"metadata": {"name": "signing", "labels": {"undolog.io/webhook-headers": "true"}}, "stringData": keys}
    await kube.request("POST", f"/api/v1/namespaces/{namespace}/secrets", secret)
    for name in names:
        hook = webhook(name, url=participant.url(f"/{name}"))
        hook["spec"]["signing"] = {"secretRef": {"name": "signing"}}
        await kube.create("webhooks", namespace, hook)


async def test_every_call_is_signed_during_a_rotation_and_a_participant_verifying_it_refuses_what_was_changed(
    kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess, cluster: Cluster
) -> None:
    old, new = new_secret(), new_secret()
    # The participant has moved to the new key; the operator still holds both (rotation).
    verifier = Verifier(new)

    def verifying(request: Received) -> Reply:
        return Reply(200, {"ok": True}) if verdict(verifier, request) is None else Reply(401, {"error": "signature"})

    for path in ("/charge-do", "/charge-undo", "/ship-do"):
        participant.handle(path, verifying)
    participant.script("/ship-do", Reply(400, {"error": "no stock"}))
    await signed_webhooks(
        kube, namespace, participant, {"a-old": old, "b-new": new}, "charge-do", "charge-undo", "ship-do"
    )
    await kube.create("sagas", namespace, saga("order", [step("charge"), step("ship", "Pivot")]))
    await saga_phase(kube, namespace, "order", "Compensated")

    forward, undo = participant.received("/charge-do")[0], participant.received("/charge-undo")[0]
    for request in (forward, undo):
        assert request.replied == 200, request
        signatures = request.headers["webhook-signature"].split(" ")
        assert len(signatures) == 2
        assert all(s.startswith("v1,") for s in signatures)
        assert request.headers["webhook-id"] == request.key  # the Idempotency-Key, stable across retries
        assert abs(int(request.headers["webhook-timestamp"]) - time.time()) < 60
        assert verdict(Verifier(old), request) is None  # a participant still on the old key accepts it too
    assert forward.headers["webhook-id"] != undo.headers["webhook-id"]

    tampered: dict[str, Any] = {**undo.__dict__, "raw": undo.raw.replace("}", ',"extra":1}', 1)}
    assert verdict(verifier, Received(**tampered)) == "No matching signature found"
    assert verdict(Verifier(new_secret()), undo) == "No matching signature found"
    stale = {**undo.headers, "webhook-timestamp": str(int(time.time()) - 600)}
    assert verdict(verifier, Received(**{**undo.__dict__, "headers": stale})) == "Message timestamp too old"

    recorded = "".join(
        cluster.kubectl("get", kind, "-n", namespace, "-o", "yaml").stdout for kind in ("sagas", "undo", "events")
    )
    assert old[6:] not in recorded
    assert new[6:] not in recorded
    assert old[6:] not in operator.log()
    assert new[6:] not in operator.log()


async def test_a_signing_secret_that_cannot_sign_halts_naming_the_key_and_sends_nothing(
    kube: Kube, namespace: str, participant: Participant, operator: OperatorProcess
) -> None:
    await signed_webhooks(kube, namespace, participant, {"current": "not-a-secret"}, "refund")
    await external_saga(kube, namespace, "bad-key", [call("refund")])
    await abort(kube, namespace, "bad-key")
    halted = await saga_phase(kube, namespace, "bad-key", "Halted")
    assert (
        f"Secret {namespace}/signing (spec.signing) key 'current' does not start with whsec_"
        in (halted["status"]["message"])
    )
    assert participant.received("/refund") == []


async def test_a_participant_that_asks_for_a_client_certificate_gets_the_one_its_webhook_names(
    kube: Kube, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    """mTLS: the participant refuses a handshake without a certificate from its client CA; the
    Webhook naming one (a kubernetes.io/tls Secret) is compensated, one naming none is not."""
    from devtools.control_plane.pki import certificate_authority, client_certificate

    secure = HttpsParticipant(tmp_path)
    clients = certificate_authority("participant-clients")
    secure.context.verify_mode = ssl.CERT_REQUIRED
    secure.context.load_verify_locations(cadata=clients.certificate_pem.decode())
    issued = client_certificate(clients, "undolog-operator")
    try:
        secret = {
            "metadata": {"name": "operator-client", "labels": {"undolog.io/webhook-headers": "true"}},
            "type": "kubernetes.io/tls",
            "stringData": {"tls.crt": issued.certificate_pem.decode(), "tls.key": issued.key_pem.decode()},
        }
        await kube.request("POST", f"/api/v1/namespaces/{namespace}/secrets", secret)
        mutual = webhook("refund", url=secure.url("/refund"), caBundle=secure.bundle)
        mutual["spec"]["clientCertificate"] = {"secretRef": {"name": "operator-client"}}
        anonymous = webhook("anonymous", url=secure.url("/anonymous"), caBundle=secure.bundle)
        anonymous["spec"]["outageBudgetSeconds"] = 2  # a refused handshake is an outage: waited out, then halted
        for hook in (mutual, anonymous):
            await kube.create("webhooks", namespace, hook)
        await external_saga(kube, namespace, "mutual", [call("refund")])
        await external_saga(kube, namespace, "anonymous", [call("anonymous")])
        for name in ("mutual", "anonymous"):
            await abort(kube, namespace, name)
        await saga_phase(kube, namespace, "mutual", "Compensated", within=30)
        halted = await saga_phase(kube, namespace, "anonymous", "Halted", within=30)
        assert halted["status"]["reason"] == "ParticipantUnavailable"
        assert [r.path for r in secure.received()] == ["/refund"]
    finally:
        secure.close()
    assert issued.key_pem.decode().splitlines()[1] not in operator.log()
