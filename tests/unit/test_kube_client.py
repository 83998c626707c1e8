"""The API client against a local HTTP server (loopback): what it does under load."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest
from aiohttp import web

from undolog import errors
from undolog.conventions import CLUSTER_CLOCK, ClusterClock, now
from undolog.kube import Kube, Timeouts
from undolog.kube.client import POOL_SIZE
from undolog.kube.kubeconfig import Credentials

Answer = Callable[[web.Request], Awaitable[web.Response]]


@contextlib.asynccontextmanager
async def api(answer: Answer) -> AsyncIterator[str]:
    """An API on loopback answering GETs of sagas with `answer`; yields its URL."""
    app = web.Application()
    app.router.add_get("/apis/undolog.io/v1beta1/namespaces/ns/sagas/{name}", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def named(request: web.Request) -> web.Response:
    return web.json_response({"metadata": {"name": request.match_info["name"]}})


@pytest.fixture
async def slow_api() -> AsyncIterator[str]:
    """An API that takes 1.5 s to answer each GET."""

    async def answer(request: web.Request) -> web.Response:
        await asyncio.sleep(1.5)
        return named(request)

    async with api(answer) as url:
        yield url


async def test_requests_queued_for_a_pooled_connection_are_not_timed_out_as_unreachable(slow_api: str) -> None:
    """More requests at once than the pool has connections: the rest wait for one, longer than
    the connect timeout, and still succeed (only reaching the API is bounded by it). The bound
    leaves a loaded machine time to connect on loopback (0.2 s did not, beside a benchmark)."""
    async with Kube(Credentials(server=slow_api), Timeouts(connect=1.0)) as kube:
        names = [f"s{i}" for i in range(POOL_SIZE + 20)]
        got = await asyncio.gather(*(kube.get("sagas", "ns", name) for name in names))
    assert [body["metadata"]["name"] for body in got] == names


async def test_a_client_apart_does_not_wait_for_the_connections_the_others_hold() -> None:
    """Lease renewals go over a pool of their own: with every connection of the shared pool
    held by requests the API has not answered (and more queued), a request apart is answered."""
    gate = asyncio.Event()

    async def answer(request: web.Request) -> web.Response:
        if request.match_info["name"] != "lease":
            await gate.wait()
        return named(request)

    async with api(answer) as url, Kube(Credentials(server=url)) as kube:
        held = [asyncio.ensure_future(kube.get("sagas", "ns", f"s{i}")) for i in range(POOL_SIZE + 5)]
        async with kube.apart() as leases:
            lease = await asyncio.wait_for(leases.get("sagas", "ns", "lease"), timeout=10)
        assert not any(request.done() for request in held)  # the shared pool was full all along
        with pytest.raises(TimeoutError):  # what the shared pool would have done
            await asyncio.wait_for(kube.get("sagas", "ns", "lease"), timeout=0.5)
        gate.set()
        await asyncio.gather(*held)
    assert lease["metadata"]["name"] == "lease"


@pytest.fixture
def cluster_clock() -> Iterator[ClusterClock]:
    """The process's cluster clock, put back as it was afterwards."""
    saved = CLUSTER_CLOCK.__dict__.copy()
    CLUSTER_CLOCK.__init__()  # type: ignore[misc]
    yield CLUSTER_CLOCK
    CLUSTER_CLOCK.__dict__.update(saved)


async def test_the_clock_follows_the_api_servers_once_it_differs_by_seconds(cluster_clock: ClusterClock) -> None:
    """Deadlines run from the apiserver's creationTimestamp, so an operator on a node whose clock
    is off judged them on its own: 20 minutes ahead, a saga with a 10-minute deadline was late
    when created. The API's `Date` tells its clock."""
    ahead = timedelta(0)

    async def answer(request: web.Request) -> web.Response:
        response = named(request)
        response.headers["Date"] = format_datetime(datetime.now(UTC) + ahead, usegmt=True)
        return response

    async with api(answer) as url, Kube(Credentials(server=url)) as kube:
        await kube.get("sagas", "ns", "s")
        assert abs(now() - datetime.now(UTC)) < timedelta(seconds=1)  # in step: nothing to follow
        ahead = timedelta(minutes=20)
        for _ in range(4):  # one odd answer does not move it; the median of the last few does
            await kube.get("sagas", "ns", "s")
        assert abs(now() - (datetime.now(UTC) + ahead)) < timedelta(seconds=2)
        ahead = timedelta(0)
        for _ in range(9):
            await kube.get("sagas", "ns", "s")
        assert cluster_clock.offset == timedelta(0)


def test_a_skew_of_a_second_is_left_alone_and_one_slow_answer_does_not_move_the_clock() -> None:
    steady = ClusterClock()
    for estimate in (0.6, -0.4, 1.5, 0.2, 0.9):
        steady.observe(estimate)
    assert steady.offset == timedelta(0)
    behind = ClusterClock()
    for estimate in (-3.0, -3.2, 40.0, -2.9, -3.1):  # 40: an answer held up on the way
        behind.observe(estimate)
    assert behind.offset == timedelta(seconds=-3.0)


async def test_a_refused_login_is_unauthorized_and_a_refused_request_forbidden_with_the_status_details() -> None:
    """401 (the credentials were not accepted, even read again) and 403 (RBAC said no) need
    different fixes; a 422's Status names the object and every field that is wrong."""
    statuses = {
        "login": (401, {"kind": "Status", "message": "Unauthorized", "reason": "Unauthorized", "code": 401}),
        "rbac": (403, {"message": 'sagas.undolog.io "rbac" is forbidden', "reason": "Forbidden", "code": 403}),
        "bad": (
            422,
            {
                "message": 'Saga.undolog.io "bad" is invalid: spec.deadlineSeconds: Invalid value: -1',
                "reason": "Invalid",
                "details": {
                    "name": "bad",
                    "group": "undolog.io",
                    "kind": "Saga",
                    "causes": [
                        {"reason": "FieldValueInvalid", "message": "Invalid value: -1", "field": "spec.deadlineSeconds"}
                    ],
                },
                "code": 422,
            },
        ),
    }

    async def answer(request: web.Request) -> web.Response:
        status, body = statuses[request.match_info["name"]]
        return web.json_response(body, status=status)

    async with api(answer) as url, Kube(Credentials(server=url, token="t")) as kube:
        with pytest.raises(errors.Unauthorized) as login:
            await kube.get("sagas", "ns", "login")
        with pytest.raises(errors.Forbidden) as rbac:
            await kube.get("sagas", "ns", "rbac")
        with pytest.raises(errors.Invalid) as bad:
            await kube.get("sagas", "ns", "bad")
    assert not isinstance(login.value, errors.Forbidden)
    assert login.value.status == 401
    assert not isinstance(rbac.value, errors.Unauthorized)
    assert rbac.value.status == 403
    assert bad.value.details == errors.StatusDetails(
        kind="Saga",
        name="bad",
        group="undolog.io",
        causes=(errors.StatusCause("Invalid value: -1", "spec.deadlineSeconds", "FieldValueInvalid"),),
    )
