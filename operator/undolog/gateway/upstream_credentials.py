"""The gateway's own credentials for its upstreams (`upstreams.<name>.credentials`): the headers
a Secret holds, sent with every HTTP request to that upstream, read again at most every
KEYS_FOR_SECONDS so a rotation shows within it. The agent's own token never goes upstream: the
gateway's connections carry only what is set here."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

import httpx2

from undolog.api.gateway import Upstream
from undolog.errors import KubeError
from undolog.kube import Kube

READ_AGAIN_AFTER = 10.0
log = logging.getLogger("undolog.gateway")
RequestHook = Callable[[httpx2.Request], Awaitable[None]]


class CredentialsUnreadable(ValueError):
    """An upstream's Secret cannot be read at start: the gateway does not start (it names the Secret)."""


class SecretHeaders:
    """One upstream's headers from its Secret."""

    def __init__(self, kube: Kube, namespace: str, upstream: str, secret: str) -> None:
        self.kube, self.namespace, self.upstream, self.secret = kube, namespace, upstream, secret
        self.headers: dict[str, str] = {}
        self.read_at = float("-inf")

    async def current(self) -> dict[str, str]:
        """The headers; the last ones read while the Secret cannot be read again (said in the log)."""
        if time.monotonic() - self.read_at < READ_AGAIN_AFTER:
            return self.headers
        try:
            _, data = await self.kube.secret(self.namespace, self.secret)
        except KubeError as error:
            if not self.headers:
                raise CredentialsUnreadable(
                    f"upstreams.{self.upstream}.credentials.headersFrom: Secret {self.namespace}/{self.secret} cannot "
                    f"be read: {error}"
                ) from None
            log.warning(
                "Secret %s/%s could not be read again (%s): its last headers stay", self.namespace, self.secret, error
            )
            self.read_at = time.monotonic()
            return self.headers
        self.headers = {name: value.decode().strip() for name, value in sorted(data.items())}
        self.read_at = time.monotonic()
        return self.headers

    async def hook(self, request: httpx2.Request) -> None:
        for name, value in (await self.current()).items():
            request.headers[name] = value


class UpstreamCredentials:
    """The request hooks of the upstreams that have credentials, by name."""

    def __init__(self, upstreams: dict[str, Upstream], kube: Kube, namespace: str) -> None:
        self.by_upstream = {
            name: SecretHeaders(kube, namespace, name, upstream.credentials.headers_from.name)
            for name, upstream in upstreams.items()
            if upstream.credentials is not None
        }

    async def read(self) -> None:
        """Every Secret, once, before the upstreams are connected: CredentialsUnreadable naming
        one that cannot be read."""
        for headers in self.by_upstream.values():
            await headers.current()

    def hooks(self, upstream: str) -> list[RequestHook]:
        found = self.by_upstream.get(upstream)
        return [found.hook] if found is not None else []
