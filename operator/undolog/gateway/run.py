"""Running the gateway: over streamable HTTP (uvicorn, with /metrics and /healthz) or over the
process's stdin and stdout (a local agent starts it as its MCP server)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib
import logging
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import uvicorn
import yaml
from mcp.server.stdio import stdio_server
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from undolog.api.gateway import Auth, Compensations, GatewayConfig
from undolog.decisions.advertised_undo import with_advertised
from undolog.decisions.expressions import ExpressionError
from undolog.decisions.policies import Policies
from undolog.decisions.tenancy import Tenants
from undolog.decisions.tool_calls import expression_problems
from undolog.errors import KubeError
from undolog.gateway.agent_requests import SESSION_HEADER, STDIO_SESSION
from undolog.gateway.authentication import Authenticator
from undolog.gateway.catalogue import ToolCatalogue, advertised, mapping_problems, raw_tools_of, tools_of
from undolog.gateway.operator_calls import OperatorCalls, compensation_tools
from undolog.gateway.operator_webhooks import OperatorWebhooks
from undolog.gateway.protected import Protected, metadata_routes
from undolog.gateway.server import Gateway
from undolog.gateway.subscriptions import Subscriptions
from undolog.gateway.upstream_credentials import UpstreamCredentials
from undolog.gateway.upstreams import Upstreams, listed_from_all
from undolog.kube import Kube

MCP_PATH = "/mcp"
log = logging.getLogger("undolog.gateway")


def load(path: str) -> GatewayConfig:
    """The configuration file; ValueError naming the file and each field that is wrong."""
    try:
        data = yaml.safe_load(Path(path).read_text())
        config = GatewayConfig.model_validate(data)
    except OSError as error:
        raise ValueError(f"{path}: {error.strerror}") from None
    except yaml.YAMLError as error:
        raise ValueError(f"{path} is not YAML: {error}") from None
    except ValidationError as error:
        said = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'the file'}: {e['msg']}" for e in error.errors())
        raise ValueError(f"{path}: {said}") from None
    problems = expression_problems(config)
    if problems:
        raise ValueError(f"{path}: {'; '.join(problems)}")
    try:
        Tenants(config), Policies(config)
    except ExpressionError as error:
        raise ValueError(f"{path}: {error}") from None
    return config


async def checked(config: GatewayConfig, upstreams: Upstreams, catalogue: ToolCatalogue) -> GatewayConfig:
    """The configuration with what the servers advertise (`compensations: fromAnnotations`),
    checked against what they list (tools, schemas): MappingRefused naming each problem."""
    if config.compensations == Compensations.FROM_ANNOTATIONS:
        listed = await listed_from_all(upstreams, raw_tools_of)
        config, said = with_advertised(config, advertised(listed))
        for line in said:
            log.info("%s", line)
    problems = mapping_problems(config, catalogue) + expression_problems(config)
    if problems:
        raise MappingRefused("the gateway's mappings do not fit its servers: " + "; ".join(problems))
    return config


class MappingRefused(ValueError):
    """The configuration does not fit what the upstream servers list: the gateway does not start."""


class Serving(uvicorn.Server):
    """uvicorn's server, stopped by SIGTERM or SIGINT without the signal being raised again once
    it has stopped (uvicorn's own way, which ended the process before the gateway could end its
    open sessions' sagas)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        loop = asyncio.get_running_loop()
        for stop in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(stop, self.handle_exit, stop, None)
        try:
            yield
        finally:
            for stop in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(stop)


def ending_sessions(app: ASGIApp, ended: Callable[[str], Any]) -> ASGIApp:
    """The ASGI app, telling `ended` of a session its client ended (a DELETE with its id that the
    SDK accepted: it refuses one of an unknown session, or of another principal's)."""

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        status = 0

        async def sent(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        await app(scope, receive, sent)
        if scope["type"] == "http" and scope["method"] == "DELETE" and 200 <= status < 300:
            key = dict(scope["headers"]).get(SESSION_HEADER.encode())
            if key:
                await ended(key.decode("latin-1"))

    return wrapped


@dataclass(frozen=True)
class Door:
    """What /mcp requires of a caller: a token its authenticator takes, the metadata it names."""

    auth: Auth
    authenticator: Authenticator
    servers: list[str]  # the authorization servers the Protected Resource Metadata names


async def door(config: GatewayConfig, kube: Kube, http: httpx2.AsyncClient) -> Door | None:
    """The door of `auth`; None with `auth: none`, said in the log."""
    if not isinstance(config.auth, Auth):
        log.warning(
            "auth: none: whoever reaches this port calls every upstream tool with the gateway's own reach, and every "
            "saga goes to namespace %s; set auth (issuers, serviceAccounts) to know who calls",
            config.namespace,
        )
        return None
    cluster = await cluster_issuer(kube) if config.auth.service_accounts else None
    servers = [issuer.issuer for issuer in config.auth.issuers] or [cluster or DEFAULT_CLUSTER_ISSUER]
    return Door(config.auth, Authenticator(config.auth, kube, http, cluster), servers)


DEFAULT_CLUSTER_ISSUER = "https://kubernetes.default.svc.cluster.local"


async def cluster_issuer(kube: Kube) -> str | None:
    """The issuer of the cluster's ServiceAccount tokens, as its discovery document says; None
    when it cannot be read (then every token not of a listed issuer goes to TokenReview)."""
    try:
        found = await kube.request("GET", "/.well-known/openid-configuration")
    except KubeError as error:
        log.warning(
            "the cluster's ServiceAccount issuer could not be read (%s): TokenReview sees every other token", error
        )
        return None
    return str(found["issuer"]) if found.get("issuer") else None


@contextlib.asynccontextmanager
async def serving(
    config: GatewayConfig, connect: Callable[[], Awaitable[Kube]], handle_key: bytes
) -> AsyncIterator[Gateway]:
    """The gateway, its upstreams connected and its mappings checked against them, until the end."""
    kube = await connect()
    try:
        subscriptions, credentials = Subscriptions(), UpstreamCredentials(config.upstreams, kube, config.namespace)
        await credentials.read()
        async with Upstreams(config.upstreams, subscriptions, credentials) as upstreams:
            catalogue = ToolCatalogue()
            catalogue.keep(await listed_from_all(upstreams, tools_of), config.upstreams)
            config = await checked(config, upstreams, catalogue)
            webhooks = OperatorWebhooks(config, compensation_tools(config, catalogue), kube)
            yield Gateway(config, kube, upstreams, catalogue, subscriptions, handle_key, webhooks)
    finally:
        await kube.close()


def http_app(gateway: Gateway, operator_calls: OperatorCalls, host: str, guard: Door | None) -> ASGIApp:
    """/mcp for agents (behind the door), the operator's route to stdio upstreams' compensations
    (which checks the operator's signatures), /metrics, /healthz, and the Protected Resource Metadata."""

    async def metrics(_: Request) -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    async def healthz(_: Request) -> Response:
        return PlainTextResponse("ok")

    routes = [Route("/metrics", metrics), Route("/healthz", healthz), operator_calls.route()]
    app = gateway.server.streamable_http_app(
        streamable_http_path=MCP_PATH,
        host=host,
        session_idle_timeout=gateway.config.idle_seconds,
        custom_starlette_routes=routes + (metadata_routes(guard.auth, guard.servers) if guard else []),
    )
    ending = ending_sessions(app, lambda key: gateway.close_session(key, "the client ended it"))
    return Protected(ending, MCP_PATH, guard.auth, guard.authenticator) if guard else ending


# What mcp.client.session imports when it first validates a tool's structured result.
VALIDATES_RESULTS = ("jsonschema", "jsonschema.validators", "referencing")


async def serve_http(
    config: GatewayConfig, host: str, port: int, connect: Callable[[], Awaitable[Kube]], handle_key: bytes
) -> None:
    async with (
        serving(config, connect, handle_key) as gateway,
        httpx2.AsyncClient(trust_env=False, timeout=10.0) as http,
    ):
        operator_calls = OperatorCalls(gateway.config, gateway.upstreams, gateway.catalogue, gateway.kube)
        await gateway.webhooks.serve_in(gateway.config.namespace)
        app = http_app(gateway, operator_calls, host, await door(gateway.config, gateway.kube, http))
        server = Serving(uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on"))
        freeze_start()
        reaper = asyncio.create_task(gateway.reap_idle())
        try:
            async with operator_calls.running():
                await server.serve()
        finally:
            reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reaper
            await gateway.close_all("the gateway stopped")


def freeze_start() -> None:
    """What was made to start (modules, schemas, clients, the catalogue) lives as long as the
    process: out of the collector's sight, the collections that land on one request in four took
    1.6 ms on average instead of 5.5 (they scanned all of it). What the mcp client imports on
    the first result it validates against a tool's output schema is imported first and frozen
    with it (jsonschema, whose URI formats build a parser: 1.4 s and 125,000 objects, which full
    collections then scanned for 50 to 90 ms, each landing on a call)."""
    for module in VALIDATES_RESULTS:
        importlib.import_module(module)
    gc.collect()
    gc.freeze()


async def serve_stdio(config: GatewayConfig, connect: Callable[[], Awaitable[Kube]], handle_key: bytes) -> None:
    async with serving(config, connect, handle_key) as gateway:
        freeze_start()
        try:
            async with stdio_server() as (read, write):
                await gateway.server.run(read, write, gateway.server.create_initialization_options())
        finally:
            await gateway.close_session(STDIO_SESSION, "stdin closed")
