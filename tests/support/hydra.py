"""Ory Hydra (bin/hydra, `make bin/hydra`: built from the Go module proxy) as a process on two
free loopback ports, its store in memory: the authorization server whose JWT access tokens
(client credentials) the gateway's authentication tests present."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import httpx
import yaml
from devtools.control_plane.local import free_ports

from tests.conftest import BIN
from tests.support.waiting import serving


class Hydra:
    def __init__(self, work: Path) -> None:
        self.public, self.admin = free_ports(2)
        folder = work / f"hydra-{self.public}"
        folder.mkdir()
        config = {
            "dsn": "memory",
            "serve": {
                "public": {"port": self.public, "host": "127.0.0.1"},
                "admin": {"port": self.admin, "host": "127.0.0.1"},
            },
            "urls": {"self": {"issuer": self.issuer}},
            "strategies": {"access_token": "jwt"},
            "secrets": {"system": ["the-test-hydra-system-secret-of-32"]},
            "log": {"level": "warn"},
        }
        (folder / "hydra.yaml").write_text(yaml.safe_dump(config))
        self.log_path = folder / "hydra.log"
        self.log = self.log_path.open("w")
        command = [str(BIN / "hydra"), "serve", "all", "--dev", "--sqa-opt-out", "-c", str(folder / "hydra.yaml")]
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT)
        serving(f"{self.issuer}.well-known/openid-configuration", self.process, self.log_path, 60)

    @property
    def issuer(self) -> str:
        return f"http://127.0.0.1:{self.public}/"

    def client(self, client_id: str, audience: list[str], lifespan: str | None = None) -> None:
        """A client of the client-credentials grant, allowed `audience`; its tokens live `lifespan` (Hydra's 1h)."""
        body: dict[str, Any] = {
            "client_id": client_id,
            "client_secret": self.secret(client_id),
            "grant_types": ["client_credentials"],
            "audience": audience,
            "token_endpoint_auth_method": "client_secret_post",
            "access_token_strategy": "jwt",
        }
        httpx.post(f"http://127.0.0.1:{self.admin}/admin/clients", json=body, timeout=10).raise_for_status()
        if lifespan is not None:
            lifespans = {"client_credentials_grant_access_token_lifespan": lifespan}
            url = f"http://127.0.0.1:{self.admin}/admin/clients/{client_id}/lifespans"
            httpx.put(url, json=lifespans, timeout=10).raise_for_status()

    @staticmethod
    def secret(client_id: str) -> str:
        return f"{client_id}-the-secret-of-the-test"

    def token(self, client_id: str, audience: str) -> str:
        """A JWT access token of the client for `audience`, from Hydra's token endpoint."""
        form = {
            "grant_type": "client_credentials",
            "client_id": client_id,
            "client_secret": self.secret(client_id),
            "audience": audience,
        }
        answer = httpx.post(f"{self.issuer}oauth2/token", data=form, timeout=10)
        answer.raise_for_status()
        return str(answer.json()["access_token"])

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(15)
        self.log.close()
