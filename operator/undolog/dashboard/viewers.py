"""Whose credentials the dashboard acts with: always the viewer's, never its own.

- Locally (`undolog dashboard`), the kubeconfig's: its context and namespace, and --as /
  --as-group impersonation, exactly as kubectl would.
- In a cluster (`--auth token`), the bearer token each request carries (from an
  authenticating proxy or ingress, or pasted once on the login page and kept in an HttpOnly,
  SameSite=Strict cookie), sent to the API as is: the way the Argo server's client mode and
  the Kubernetes dashboard work. The dashboard's pod needs no ServiceAccount token at all.
- Behind a reverse proxy doing OIDC (`--auth proxy`), the token the proxy passes in a header
  (oauth2-proxy's X-Forwarded-Access-Token by default), and nothing else: no login page, no
  cookie; a request without it did not come through the proxy and is refused.
"""

from __future__ import annotations

import hashlib
import os
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from aiohttp import web

from undolog.kube import Kube, default_namespace

TOKEN_COOKIE = "undolog_token"
IN_CLUSTER_CA = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
CACHED_CLIENTS = 64


class Viewers(Protocol):
    async def client(self, request: web.Request) -> Kube | None:
        """The API client acting as the viewer of this request; None: they must sign in."""
        ...

    @property
    def default_namespace(self) -> str | None:
        """The namespace shown first (None: every namespace the viewer may read)."""
        ...

    @property
    def login(self) -> bool:
        """Whether a viewer may sign in with a token on the login page."""
        ...

    async def close(self) -> None: ...


@dataclass
class KubeconfigViewer:
    """One person at their own machine: the kubeconfig decides who they are."""

    kubeconfig: str | None = None
    context: str | None = None
    as_user: str | None = None
    as_groups: Sequence[str] = ()
    _kube: Kube | None = None

    async def client(self, request: web.Request) -> Kube | None:
        if self._kube is None:
            self._kube = await Kube.connect(
                self.kubeconfig, self.context, as_user=self.as_user, as_groups=tuple(self.as_groups)
            )
        return self._kube

    @property
    def default_namespace(self) -> str | None:
        return default_namespace(self.kubeconfig, self.context)

    @property
    def login(self) -> bool:
        return False

    async def close(self) -> None:
        if self._kube is not None:
            await self._kube.close()


@dataclass
class TokenViewers:
    """Many people, each with their own token; clients cached by a hash of it (never the token)."""

    server: str
    ca_file: str | None
    _clients: OrderedDict[str, Kube] = field(default_factory=OrderedDict)

    @classmethod
    def in_cluster(cls, server: str | None, ca_file: str | None) -> TokenViewers:
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if server is None and host is None:
            raise ValueError("--auth token and --auth proxy need --api-server outside a cluster")
        return cls(server or f"https://{host}:{port}", ca_file or IN_CLUSTER_CA)

    def token_of(self, request: web.Request) -> str | None:
        header = request.headers.get("Authorization", "")
        if header.lower().startswith("bearer "):
            return header[7:].strip() or None
        return request.cookies.get(TOKEN_COOKIE) or None

    async def client(self, request: web.Request) -> Kube | None:
        token = self.token_of(request)
        if token is None:
            return None
        key = hashlib.sha256(token.encode()).hexdigest()
        kube = self._clients.get(key)
        if kube is None:
            kube = Kube.with_token(self.server, self.ca_file, token)
            self._clients[key] = kube
            while len(self._clients) > CACHED_CLIENTS:
                await self._clients.popitem(last=False)[1].close()
        self._clients.move_to_end(key)
        return kube

    @property
    def default_namespace(self) -> str | None:
        return None

    @property
    def login(self) -> bool:
        return True

    async def close(self) -> None:
        for kube in self._clients.values():
            await kube.close()
        self._clients.clear()


@dataclass
class ProxyViewers(TokenViewers):
    """Each request's token from the header an authenticating proxy sets (an OIDC access or ID
    token the API accepts), never from a cookie or the login page."""

    header: str = "X-Forwarded-Access-Token"

    @classmethod
    def behind(cls, header: str, server: str | None, ca_file: str | None) -> ProxyViewers:
        found = cls.in_cluster(server, ca_file)
        return cls(found.server, found.ca_file, header=header)

    def token_of(self, request: web.Request) -> str | None:
        value = request.headers.get(self.header, "").strip()
        return (value[7:].strip() if value.lower().startswith("bearer ") else value) or None

    @property
    def login(self) -> bool:
        return False
