"""The gateway's own credentials for its upstreams (`upstreams.<name>.credentials`), put on
every HTTP request to that upstream by a request hook: the headers a Secret holds (read again
at most every READ_AGAIN_AFTER, so a rotation shows within it), an access token of an OAuth
client-credentials grant (its client in a Secret; asked for again before it expires), or a
client certificate presented in TLS (the connections' TLS context, its chain loaded again from
the Secret as often: a new connection presents the rotated one). The agent's own token never
goes upstream: the gateway's connections carry only what is set here."""

from __future__ import annotations

import asyncio
import logging
import ssl
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx2

from undolog.api.gateway import ClientCredentials, Upstream
from undolog.errors import KubeError
from undolog.kube import Kube

READ_AGAIN_AFTER = 10.0
RENEW_BEFORE = 30.0  # a token is asked for again this long before it expires
log = logging.getLogger("undolog.gateway")
RequestHook = Callable[[httpx2.Request], Awaitable[None]]


class CredentialsUnreadable(ValueError):
    """An upstream's credential cannot be had at start: the gateway does not start (it says why)."""


class Credential(ABC):
    """One upstream's headers; the last good ones kept while they cannot be had again (logged)."""

    def __init__(self, kube: Kube, namespace: str, upstream: str) -> None:
        self.kube, self.namespace, self.upstream = kube, namespace, upstream
        self.headers: dict[str, str] = {}
        self.good_until = float("-inf")
        self.lock = asyncio.Lock()

    async def current(self) -> dict[str, str]:
        if time.monotonic() < self.good_until:  # every request asks: the fresh case takes no lock
            return self.headers
        async with self.lock:  # one read or grant at a time, whatever the requests in flight
            if time.monotonic() < self.good_until:
                return self.headers
            try:
                self.headers, seconds = await self.fetched()
            except (httpx2.HTTPError, ValueError, KeyError) as error:
                if not self.headers:
                    raise CredentialsUnreadable(f"upstreams.{self.upstream}.credentials: {error}") from None
                log.warning(
                    "the credential of %s could not be had again (%s): the last one stays", self.upstream, error
                )
                seconds = READ_AGAIN_AFTER
            self.good_until = time.monotonic() + seconds
            return self.headers

    @abstractmethod
    async def fetched(self) -> tuple[dict[str, str], float]:
        """The headers, and for how many seconds they hold."""

    async def hook(self, request: httpx2.Request) -> None:
        for name, value in (await self.current()).items():
            request.headers[name] = value

    async def secret(self, name: str) -> dict[str, str]:
        try:
            _, data = await self.kube.secret(self.namespace, name)
        except KubeError as error:
            raise ValueError(f"Secret {self.namespace}/{name} cannot be read: {error}") from None
        return {key: value.decode().strip() for key, value in sorted(data.items())}


class SecretHeaders(Credential):
    def __init__(self, kube: Kube, namespace: str, upstream: str, name: str) -> None:
        super().__init__(kube, namespace, upstream)
        self.name = name

    async def fetched(self) -> tuple[dict[str, str], float]:
        return await self.secret(self.name), READ_AGAIN_AFTER


class GrantedToken(Credential):
    def __init__(self, kube: Kube, namespace: str, upstream: str, grant: ClientCredentials) -> None:
        super().__init__(kube, namespace, upstream)
        self.grant = grant

    async def fetched(self) -> tuple[dict[str, str], float]:
        client = await self.secret(self.grant.secret.name)
        form = {
            "grant_type": "client_credentials",
            "client_id": client["client_id"],
            "client_secret": client["client_secret"],
        }
        if self.grant.audience:
            form["audience"] = self.grant.audience
        if self.grant.scopes:
            form["scope"] = " ".join(self.grant.scopes)
        async with httpx2.AsyncClient(trust_env=False, timeout=10.0) as http:
            answer = await http.post(self.grant.token_url, data=form)
        if answer.status_code != 200:
            raise ValueError(f"{self.grant.token_url} answered {answer.status_code}: {answer.text[:300]}")
        token = answer.json()
        lives = float(token.get("expires_in") or 3600)
        return {"Authorization": f"Bearer {token['access_token']}"}, max(1.0, lives - RENEW_BEFORE)


class ClientCertificate(Credential):
    """No header: the certificate goes into `context`, which the upstream's HTTP client uses."""

    def __init__(self, kube: Kube, namespace: str, upstream: str, name: str) -> None:
        super().__init__(kube, namespace, upstream)
        self.name = name
        self.context = ssl.create_default_context()
        self.authorities: set[str] = set()

    async def fetched(self) -> tuple[dict[str, str], float]:
        found = await self.secret(self.name)
        if found.get("ca.crt") and found["ca.crt"] not in self.authorities:
            self.context.load_verify_locations(cadata=found["ca.crt"])
            self.authorities.add(found["ca.crt"])
        try:
            chained(self.context, found["tls.crt"], found["tls.key"])
        except ssl.SSLError as error:
            raise ValueError(
                f"Secret {self.namespace}/{self.name} holds no usable tls.crt and tls.key: {error}"
            ) from None
        return {}, READ_AGAIN_AFTER


def chained(context: ssl.SSLContext, chain: str, key: str) -> None:
    """The chain loaded into the context, through a private folder: OpenSSL reads one from files
    only. On the event loop, not a thread, as the loop's handshakes use the context (a few
    kilobytes written every 10 s)."""
    with tempfile.TemporaryDirectory() as folder:
        chain_file, key_file = Path(folder, "tls.crt"), Path(folder, "tls.key")
        chain_file.write_text(chain)
        key_file.touch(mode=0o600)
        key_file.write_text(key)
        context.load_cert_chain(chain_file, key_file)


class UpstreamCredentials:
    """The request hooks of the upstreams that have credentials, by name."""

    def __init__(self, upstreams: dict[str, Upstream], kube: Kube, namespace: str) -> None:
        self.by_upstream: dict[str, Credential] = {}
        for name, upstream in upstreams.items():
            said = upstream.credentials
            if said is not None and said.headers_from is not None:
                self.by_upstream[name] = SecretHeaders(kube, namespace, name, said.headers_from.name)
            elif said is not None and said.client_credentials is not None:
                self.by_upstream[name] = GrantedToken(kube, namespace, name, said.client_credentials)
            elif said is not None and said.client_certificate is not None:
                self.by_upstream[name] = ClientCertificate(kube, namespace, name, said.client_certificate.name)

    async def read(self) -> None:
        """Every credential, once, before the upstreams are connected: CredentialsUnreadable
        saying which cannot be had."""
        for credential in self.by_upstream.values():
            await credential.current()

    def hooks(self, upstream: str) -> list[RequestHook]:
        found = self.by_upstream.get(upstream)
        return [found.hook] if found is not None else []

    def tls(self, upstream: str) -> ssl.SSLContext | bool:
        """What the upstream's HTTP client verifies and presents with: its certificate's context, else the defaults."""
        found = self.by_upstream.get(upstream)
        return found.context if isinstance(found, ClientCertificate) else True
