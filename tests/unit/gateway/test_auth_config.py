"""The gateway's `auth` (api/gateway.py): said or refused, naming the fix."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError
from typer.testing import CliRunner

from tests.support.gateway_settings import UPSTREAMS
from tests.support.gateway_settings import settings as config
from undolog.api.gateway import Auth
from undolog.cli.app import app


def test_auth_needs_a_way_in_and_takes_no_shared_secret_signatures() -> None:
    with pytest.raises(ValidationError, match="name issuers, or serviceAccounts: true"):
        config(auth={"resource": "https://gateway.example/mcp"})
    with pytest.raises(ValidationError, match="HS256 refused: only public-key signatures prove an issuer"):
        config(
            auth={"resource": "https://g.example/mcp", "issuers": [{"issuer": "https://i/", "algorithms": ["HS256"]}]}
        )
    taken = config(auth={"resource": "https://g.example/mcp", "serviceAccounts": True})
    assert isinstance(taken.auth, Auth)
    assert (taken.auth.service_accounts, taken.auth.clock_skew_seconds) == (True, 30)


def test_the_gateway_will_not_serve_http_before_its_configuration_says_who_may_call(tmp_path: Path) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump({"namespace": "agents", "upstreams": UPSTREAMS}))
    result = CliRunner().invoke(app, ["mcp", "--config", str(path)])
    assert result.exit_code == 2
    said = " ".join(result.output.split())
    assert "auth: say who may call the gateway" in said
    assert "`auth: none` to serve anyone who reaches its port" in said
