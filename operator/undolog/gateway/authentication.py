"""Bearer tokens to principals: a JWT of a configured issuer, verified with PyJWT (the JOSE
library the `mcp` package already depends on) against the keys the issuer publishes (fetched,
cached, fetched again for a key not seen yet), its `iss`, `aud` (the gateway's resource URL),
`exp`, `nbf` and `sub` checked; else a ServiceAccount token of the cluster, which TokenReview
checks for that audience. A refusal says why, for the 401's error_description."""

from __future__ import annotations

import hashlib
import logging
import time
from collections import OrderedDict
from datetime import UTC, datetime
from typing import Any

import httpx2
import jwt

from undolog.api.gateway import Auth, Issuer
from undolog.decisions.principals import Principal, reviewed
from undolog.errors import KubeError
from undolog.kube import Kube

KEYS_AGAIN_AFTER = 10.0  # an unknown key id makes the issuer's keys be fetched again, at most this often
KEYS_FOR_SECONDS = 3600.0  # the issuer's keys are fetched again after this, to follow a rotation
REVIEWED_FOR_SECONDS = 10.0  # a ServiceAccount token's review is kept this long (a deleted pod's token ends)
VERIFIED_FOR_SECONDS = 60.0  # a JWT's verification is kept this long, and never past its exp
REFUSED_FOR_SECONDS = 10.0  # a refused token is refused again without a second check this long
KNOWN_TOKENS = 10_000  # tokens remembered, verified or refused (the least recent forgotten first)
LEGACY_SERVICE_ACCOUNT_ISSUER = "kubernetes/serviceaccount"  # a token of a ServiceAccount's Secret
MAX_METADATA_BYTES = 1024 * 1024
log = logging.getLogger("undolog.gateway")


class Refused(Exception):
    """The token proves no principal: why, for the caller."""


class Unavailable(Exception):
    """What would check the token cannot be reached now (an issuer's keys, TokenReview): try again."""


def _when(seconds: object) -> str:
    stamp = seconds if isinstance(seconds, int | float) else 0
    return datetime.fromtimestamp(stamp, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class IssuerKeys:
    """One issuer's published keys (JWKS)."""

    def __init__(self, issuer: Issuer, http: httpx2.AsyncClient) -> None:
        self.issuer, self.http = issuer, http
        self.keys: dict[str, jwt.PyJWK] = {}
        self.fetched_at = float("-inf")

    async def key(self, kid: str | None) -> jwt.PyJWK:
        stale = time.monotonic() - self.fetched_at
        if (kid not in self.keys and stale > KEYS_AGAIN_AFTER) or stale > KEYS_FOR_SECONDS:
            await self._fetch()
        if kid is None and len(self.keys) == 1:
            return next(iter(self.keys.values()))
        found = self.keys.get(kid or "")
        if found is None:
            raise Refused(f"it is signed with a key {self.issuer.issuer} does not publish (kid {kid!r})")
        return found

    async def _fetch(self) -> None:
        try:
            uri = self.issuer.jwks_uri or await self._jwks_uri()
            document = await self._json(uri)
            keys = jwt.PyJWKSet.from_dict(document).keys
        except (httpx2.HTTPError, ValueError, jwt.PyJWTError) as error:
            raise Unavailable(f"the keys of issuer {self.issuer.issuer} could not be read: {error}") from None
        self.keys = {str(key.key_id or ""): key for key in keys}
        self.fetched_at = time.monotonic()

    async def _jwks_uri(self) -> str:
        base = self.issuer.issuer.rstrip("/")
        for well_known in ("openid-configuration", "oauth-authorization-server"):
            try:
                metadata = await self._json(f"{base}/.well-known/{well_known}")
            except httpx2.HTTPStatusError:
                continue
            if isinstance(metadata.get("jwks_uri"), str):
                return str(metadata["jwks_uri"])
        raise ValueError(f"neither of its metadata documents at {base}/.well-known/ names a jwks_uri")

    async def _json(self, url: str) -> dict[str, Any]:
        answer = await self.http.get(url)
        answer.raise_for_status()
        if len(answer.content) > MAX_METADATA_BYTES:
            raise ValueError(f"{url} answered more than {MAX_METADATA_BYTES} bytes")
        document = answer.json()
        if not isinstance(document, dict):
            raise ValueError(f"{url} did not answer a JSON object")
        return document


class Authenticator:
    def __init__(self, auth: Auth, kube: Kube, http: httpx2.AsyncClient, cluster_issuer: str | None = None) -> None:
        """`cluster_issuer`: the issuer of the cluster's ServiceAccount tokens, when known; only
        a token of it (or a legacy Secret's) is sent to TokenReview."""
        self.auth, self.kube = auth, kube
        self.issuers = {issuer.issuer: IssuerKeys(issuer, http) for issuer in auth.issuers}
        self.cluster_issuers = {cluster_issuer, LEGACY_SERVICE_ACCOUNT_ISSUER} if cluster_issuer else None
        self.known: OrderedDict[str, tuple[Principal | Refused, float]] = OrderedDict()

    async def principal(self, token: str) -> Principal:
        """The principal the token proves; Refused saying why not (a refusal is remembered
        REFUSED_FOR_SECONDS, so a token sent again costs no second review), Unavailable when it
        cannot be told now."""
        digest = hashlib.sha256(token.encode()).hexdigest()
        known = self.known.get(digest)
        if known is not None and known[1] > time.monotonic():
            self.known.move_to_end(digest)
            if isinstance(known[0], Refused):
                raise known[0]
            return known[0]
        found: Principal | Refused
        try:
            found, seconds = await self._verified(token)
        except Refused as refused:
            found, seconds = refused, REFUSED_FOR_SECONDS
        self.known[digest] = (found, time.monotonic() + seconds)
        while len(self.known) > KNOWN_TOKENS:
            self.known.popitem(last=False)
        if isinstance(found, Refused):
            raise found
        return found

    async def _verified(self, token: str) -> tuple[Principal, float]:
        try:
            header = jwt.get_unverified_header(token)
            issuer = jwt.decode(token, options={"verify_signature": False}).get("iss")
        except jwt.PyJWTError:
            raise Refused("the bearer token is not a JWT") from None
        keys = self.issuers.get(str(issuer))
        if keys is not None:
            principal = await self._jwt(token, header, keys)
            left = (principal.expires_at or 0) - time.time()
            return principal, max(0.0, min(VERIFIED_FOR_SECONDS, left))
        if self.auth.service_accounts and (self.cluster_issuers is None or issuer in self.cluster_issuers):
            return await self._service_account(token), REVIEWED_FOR_SECONDS
        trusted = ", ".join([*self.issuers, *(sorted(i for i in self.cluster_issuers or () if i))]) or "none"
        raise Refused(f"its issuer {issuer!r} is not one this gateway trusts ({trusted})")

    async def _jwt(self, token: str, header: dict[str, Any], keys: IssuerKeys) -> Principal:
        issuer = keys.issuer
        key = await keys.key(header.get("kid"))
        try:
            claims = jwt.decode(
                token,
                key,
                algorithms=issuer.algorithms,
                audience=self.auth.resource,
                issuer=issuer.issuer,
                leeway=self.auth.clock_skew_seconds,
                options={"require": ["exp", "iss", "aud", "sub"]},
            )
        except jwt.PyJWTError as error:
            raise Refused(self._why(error, token)) from None
        return Principal(issuer.issuer, str(claims["sub"]), claims, expires_at=int(claims["exp"]))

    def _why(self, error: jwt.PyJWTError, token: str) -> str:
        claims = jwt.decode(token, options={"verify_signature": False})
        if isinstance(error, jwt.ExpiredSignatureError):
            return f"the token expired at {_when(claims.get('exp'))}"
        if isinstance(error, jwt.ImmatureSignatureError):
            return f"the token is not valid before {_when(claims.get('nbf'))}"
        if isinstance(error, jwt.InvalidAudienceError):
            audience = claims.get("aud")
            named = ", ".join(map(str, audience)) if isinstance(audience, list) else str(audience)
            return f"the token is for audience {named}, not this gateway ({self.auth.resource})"
        if isinstance(error, jwt.MissingRequiredClaimError):
            return f"the token has no {error.claim!r} claim"
        if isinstance(error, jwt.InvalidSignatureError):
            return "its signature does not verify with its issuer's key"
        if isinstance(error, jwt.InvalidAlgorithmError):
            return (
                f"its algorithm is not one accepted here ({', '.join(self.issuers[claims['iss']].issuer.algorithms)})"
            )
        return f"the token is not valid: {error}"

    async def _service_account(self, token: str) -> Principal:
        review = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token, "audiences": [self.auth.resource]},
        }
        try:
            answered = await self.kube.request("POST", "/apis/authentication.k8s.io/v1/tokenreviews", review)
        except KubeError as error:
            raise Unavailable(f"the cluster could not review the token: {error}") from None
        status = answered.get("status") or {}
        if not status.get("authenticated"):
            said = status.get("error") or "not authenticated"
            raise Refused(f"the cluster does not accept it as a token for {self.auth.resource}: {said}")
        principal = reviewed(status.get("user") or {}, "kubernetes")
        if principal is None:
            raise Refused(f"{(status.get('user') or {}).get('username')!r} is not a ServiceAccount")
        return principal
