"""Tokens to principals (gateway/authentication.py) with the cluster's review faked: a refused
token is not reviewed again at once, and only a token of the cluster's issuer is reviewed."""

from __future__ import annotations

import time
from typing import Any, cast

import httpx2
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from undolog.api.gateway import Auth
from undolog.gateway.authentication import Authenticator, Refused
from undolog.kube import Kube

CLUSTER = "https://kubernetes.default.svc.cluster.local"
AUTH = Auth(resource="https://gateway.example/mcp", service_accounts=True)
KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)


class Reviews:
    """The TokenReview API: accepts `good`, counts what it was asked."""

    def __init__(self, good: str) -> None:
        self.good, self.asked = good, 0

    async def request(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        self.asked += 1
        if body["spec"]["token"] == self.good and body["spec"]["audiences"] == [AUTH.resource]:
            user = {"username": "system:serviceaccount:team-b:agent", "groups": ["system:serviceaccounts"]}
            return {"status": {"authenticated": True, "user": user}}
        return {"status": {"authenticated": False, "error": "invalid bearer token"}}


def token(issuer: str, subject: str = "system:serviceaccount:team-b:agent") -> str:
    now = int(time.time())
    claims = {"iss": issuer, "sub": subject, "aud": [AUTH.resource], "iat": now, "exp": now + 600}
    return jwt.encode(claims, KEY, algorithm="RS256")


async def test_a_service_account_is_reviewed_once_and_a_refusal_is_not_reviewed_again_at_once() -> None:
    good, forged = token(CLUSTER), token(CLUSTER, "system:serviceaccount:team-a:admin")
    reviews = Reviews(good)
    async with httpx2.AsyncClient() as http:
        authenticator = Authenticator(AUTH, cast(Kube, reviews), http, CLUSTER)
        for _ in range(3):
            assert (await authenticator.principal(good)).name == "system:serviceaccount:team-b:agent"
            with pytest.raises(Refused, match="the cluster does not accept it as a token for"):
                await authenticator.principal(forged)
        assert reviews.asked == 2  # one each: kept, the good for 10 s, the refusal for 10 s
        with pytest.raises(Refused, match=r"its issuer 'https://elsewhere\.example/' is not one this gateway trusts"):
            await authenticator.principal(token("https://elsewhere.example/"))
        assert reviews.asked == 2  # not the cluster's: never sent to the cluster
