"""The dashboard answers only to its own names and its own forms, and tells browsers not to run
or frame anything else: a page rebinding its DNS name to 127.0.0.1 cannot read it or press its
buttons (a retry from `Host: evil.example` was carried out as the local user before)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from tests.unit.test_phases import make_saga
from undolog.dashboard.guards import allowed_hosts, host_name
from undolog.dashboard.server import application, page_of
from undolog.kube import Kube


class NobodySignedIn:
    """Viewers with no one signed in: every page sends them to the login page."""

    async def client(self, request: web.Request) -> Kube | None:
        return None

    @property
    def default_namespace(self) -> str | None:
        return None

    @property
    def login(self) -> bool:
        return False

    async def close(self) -> None:
        return None


@pytest_asyncio.fixture
async def client() -> AsyncIterator[TestClient[web.Request, web.Application]]:
    app = application(NobodySignedIn(), hosts=allowed_hosts("127.0.0.1", ["undolog.example"]))
    async with TestClient(TestServer(app, host="127.0.0.1")) as served:
        yield served


async def test_a_rebound_name_is_refused_and_loopback_or_an_allowed_name_is_served(
    client: TestClient[web.Request, web.Application],
) -> None:
    port = client.port
    refused = await client.get("/sagas", headers={"Host": f"evil.example:{port}"}, allow_redirects=False)
    assert refused.status == 421
    assert "--allowed-host evil.example" in await refused.text()
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "undolog.example"):
        served = await client.get("/sagas", headers={"Host": host}, allow_redirects=False)
        assert served.status == 303, host  # to the login page: the dashboard answered
    rebound = await client.post(
        "/sagas/ns/s/retry",
        headers={"Host": f"evil.example:{port}", "Origin": f"http://evil.example:{port}"},
        data={"csrf": "x"},
    )
    assert rebound.status == 421


async def test_a_form_from_another_origin_is_refused_and_every_answer_forbids_framing_and_foreign_scripts(
    client: TestClient[web.Request, web.Application],
) -> None:
    host = f"127.0.0.1:{client.port}"
    posted = await client.post(
        "/retry-halted", headers={"Host": host, "Origin": "http://elsewhere.example"}, data={"csrf": "x"}
    )
    assert posted.status == 403
    rebound = await client.get("/sagas", headers={"Host": "evil.example"}, allow_redirects=False)
    redirected = await client.get("/sagas", headers={"Host": host}, allow_redirects=False)
    missing = await client.get("/no-such-page", headers={"Host": host}, allow_redirects=False)
    served = await client.get("/healthz", headers={"Host": host})
    # Refusals, redirects and errors too: each is a page a browser may render or frame.
    for answer in (posted, rebound, redirected, missing, served):
        assert "frame-ancestors 'none'" in answer.headers["Content-Security-Policy"], answer.status
        assert "script-src 'self'" in answer.headers["Content-Security-Policy"]
        assert answer.headers["X-Frame-Options"] == "DENY"


@pytest.mark.parametrize(
    ("address", "given", "allowed"),
    [
        ("127.0.0.1", [], {"localhost", "127.0.0.1", "[::1]", "::1"}),
        ("0.0.0.0", [], None),  # in a pod, behind a Service or an Ingress: any, unless told
        ("0.0.0.0", ["Undolog.Example"], {"undolog.example", "localhost", "127.0.0.1", "[::1]", "::1"}),
    ],
)
def test_which_names_it_answers_to(address: str, given: list[str], allowed: set[str] | None) -> None:
    assert allowed_hosts(address, given) == (frozenset(allowed) if allowed is not None else None)


@pytest.mark.parametrize(
    ("host", "name"), [("a.example:80", "a.example"), ("[::1]:8000", "[::1]"), ("a.example", "a.example")]
)
def test_the_name_of_a_host_header(host: str, name: str) -> None:
    assert host_name(host) == name


def test_the_live_list_is_shown_a_page_at_a_time() -> None:
    sagas = [make_saga("Active") for _ in range(250)]
    first = page_of(sagas, "")
    assert (len(first.items), first.first, first.total, first.previous, first.next) == (100, 1, 250, None, 2)
    last = page_of(sagas, "3")
    assert (len(last.items), last.first, last.previous, last.next) == (50, 201, 2, None)
    assert page_of(sagas, "9").first == 1  # past the end, or not a number: the first page
    assert page_of(sagas, "x").first == 1
    assert page_of([], "1").next is None
