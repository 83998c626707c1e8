"""The triage dashboard: server-rendered pages over the read model (undolog.inspect), live
through server-sent events, acting with the viewer's own credentials (dashboard.viewers).

Pages: the list (Halted first, filters in the URL), a saga (its undo stack drawn newest on top,
outputs, conditions, the Event timeline), a Webhook. Actions (retry, skip, abort, and a batch
retry of every saga halted on one function) are plain HTML forms with a reason; they go
through the same rules as the CLI and become the annotations the operator consumes. No
JavaScript build: one small script swaps the live region when the API says something changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from typing import Any
from urllib.parse import urlencode

import jinja2
from aiohttp import web
from yarl import URL

from undolog import errors
from undolog.api import Saga, SagaPhase, UndoEntry
from undolog.archive import ArchiveStore, HistoryQuery
from undolog.conventions import now
from undolog.dashboard import pictures
from undolog.dashboard.guards import allowed_hosts, guarded, send_security_headers
from undolog.dashboard.overview import read_overview
from undolog.dashboard.viewers import TOKEN_COOKIE, ProxyViewers, TokenViewers, Viewers
from undolog.decisions import compensation_plan, resolutions
from undolog.decisions.phases import TERMINAL
from undolog.inspect import Inspector, SagaDetail, age, conflict_fields, duration, expires_in
from undolog.kube import Kube

log = logging.getLogger("undolog.dashboard")
CSRF_COOKIE = "undolog_csrf"
KEEPALIVE_SECONDS = 15.0
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
VIEWERS = web.AppKey("viewers", Viewers)
ARCHIVE: web.AppKey[ArchiveStore | None] = web.AppKey("archive")
LIST_PAGE = 100  # sagas a page of the live list shows (halted first: they are on the first)
HISTORY_PAGE = 50
TEMPLATES = web.AppKey("templates", jinja2.Environment)
BASE = web.AppKey("base", str)  # the path prefix it is served under ("" or "/undolog"): --base-path
SYMBOLS = {  # readable without colour: every phase also has a symbol and its name
    SagaPhase.HALTED: "‖",
    SagaPhase.FAILED: "✗",
    SagaPhase.COMPENSATING: "↺",
    SagaPhase.REWINDING: "⟲",
    SagaPhase.ACTIVE: "▸",
    SagaPhase.COMPLETED: "✓",
    SagaPhase.COMPENSATED: "↩",
}


def base_path(text: str) -> str:
    """--base-path as a prefix: "" for none, else "/name" (one leading slash, none trailing)."""
    cleaned = "/" + text.strip().strip("/")
    plain = re.fullmatch(r"(/[A-Za-z0-9._~-]+)+", cleaned) and not {".", ".."} & set(cleaned.split("/"))
    if cleaned != "/" and not plain:
        raise ValueError(f"--base-path {text!r}: a URL path such as /undolog (letters, digits, . _ ~ - and /)")
    return "" if cleaned == "/" else cleaned


def templates() -> jinja2.Environment:
    environment = jinja2.Environment(
        loader=jinja2.PackageLoader("undolog.dashboard", "templates"),
        autoescape=True,
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=jinja2.StrictUndefined,
    )
    environment.filters["age"] = age
    environment.filters["expires_in"] = expires_in
    environment.filters["clock"] = lambda m: m.strftime("%H:%M:%S.%f")[:-3] if m else ""
    environment.filters["pretty"] = lambda value: json.dumps(value, indent=2, ensure_ascii=False)
    environment.globals["symbols"] = SYMBOLS
    environment.globals["phases"] = list(SagaPhase)
    return environment


@dataclass
class Page:
    """What every page knows of its request: the viewer's client, who they are, the form token."""

    request: web.Request
    kube: Kube
    csrf: str

    @property
    def inspector(self) -> Inspector:
        return Inspector(self.kube, self.request.app[ARCHIVE])

    def url(self, path: str) -> str:
        return self.request.app[BASE] + path

    def render(self, template: str, status: int = 200, **context: Any) -> web.Response:
        environment = self.request.app[TEMPLATES]
        fragment = self.request.query.get("fragment") == "1"
        body = environment.get_template(template).render(
            fragment=fragment,
            csrf=self.csrf,
            viewer=self.request.get("viewer", ""),
            login=self.request.app[VIEWERS].login,
            path=self.request.path_qs,
            notice=self.request.query.get("notice", ""),
            history=self.request.app[ARCHIVE] is not None,
            base=self.request.app[BASE],
            **context,
        )
        response = web.Response(text=body, content_type="text/html", status=status)
        response.set_cookie(CSRF_COOKIE, self.csrf, httponly=True, samesite="Strict", path=self.url("/"))
        return response


def page(handler: Callable[[Page], Awaitable[web.StreamResponse]]) -> Handler:
    """The viewer's client (or the login page), the CSRF check on forms, API refusals shown."""

    async def wrapped(request: web.Request) -> web.StreamResponse:
        viewers = request.app[VIEWERS]
        kube = await viewers.client(request)
        if kube is None and isinstance(viewers, ProxyViewers):
            raise web.HTTPUnauthorized(
                text=f"no {viewers.header} header: this dashboard is reached through its authenticating proxy, "
                "which passes the viewer's token in it"
            )
        if kube is None:
            raise web.HTTPSeeOther(request.app[BASE] + "/login?" + urlencode({"next": request.path_qs}))
        csrf = request.cookies.get(CSRF_COOKIE) or secrets.token_urlsafe(24)
        if request.method == "POST":
            form = await request.post()
            if not secrets.compare_digest(str(form.get("csrf", "")), csrf):
                raise web.HTTPForbidden(text="the form expired: reload the page and try again")
        current = Page(request, kube, csrf)
        with contextlib.suppress(errors.KubeError):
            request["viewer"] = await kube.whoami()
        try:
            return await handler(current)
        except errors.CommandError as refused:
            return current.render("error.html", status=409, message=str(refused))
        except errors.Unauthorized as refused:
            message = f"unauthorized: {refused.message}: your credentials were not accepted; log in again"
            return current.render("error.html", status=401, message=message)
        except errors.Forbidden as refused:
            return current.render("error.html", status=403, message=f"forbidden: {refused.message}")
        except errors.KubeError as refused:
            return current.render("error.html", status=502, message=refused.message)

    return wrapped


def scope(current: Page) -> str | None:
    namespace = current.request.query.get("namespace")
    if namespace is None:
        return current.request.app[VIEWERS].default_namespace
    return namespace or None  # an empty choice: every namespace


# -- pages ------------------------------------------------------------------------------------------


@page
async def overview_page(current: Page) -> web.StreamResponse:
    """The installation at a glance: the sagas by phase, the halted ones by the function they
    wait on and their namespace, the compensations of the last hour."""
    namespace = scope(current)
    moment = now()
    seen = await read_overview(current.inspector.ledger, namespace, moment)
    return current.render(
        "overview.html",
        seen=seen,
        namespace=namespace or "",
        phases=pictures.bars([(p.value, n, p.value.lower()) for p, n in seen.phases]),
        hour=pictures.columns(seen.compensated, moment),
        events=current.url("/events?" + urlencode({"namespace": namespace or ""})),
    )


@page
async def saga_list(current: Page) -> web.StreamResponse:
    query = current.request.query
    phase = SagaPhase(query["phase"]) if query.get("phase") in set(SagaPhase) else None
    namespace = scope(current)
    try:
        older_than = duration(query["older_than"]) if query.get("older_than", "").strip() else None
    except ValueError as bad:
        return current.render("error.html", status=400, message=f"older than: {bad}")
    listed = await current.inspector.listing(
        namespace,
        phase=phase,
        org=query.get("org") or None,
        principal=query.get("principal") or None,
        function=query.get("function") or None,
        older_than=older_than,
    )
    filters = {k: query.get(k, "") for k in ("phase", "org", "principal", "function", "older_than", "name")}
    filters["namespace"] = namespace or ""
    sagas = [s for s in listed.sagas if filters["name"].strip() in s.metadata.name]
    shown = page_of(sagas, query.get("page", ""))
    events = current.url("/events?" + urlencode({"namespace": namespace or ""}))
    halted = [s for s in sagas if s.status.phase == SagaPhase.HALTED]
    functions = sorted(await current.inspector.compensations_called(halted, namespace))
    return current.render(
        "sagas.html",
        sagas=shown.items,
        shown=shown,
        unreadable=listed.unreadable,
        filters=filters,
        events=events,
        functions=functions,
    )


@dataclass(frozen=True)
class Shown:
    """One page of a list: its items, where it starts (1-based), the total, the pages around it."""

    items: list[Saga]
    first: int
    total: int
    previous: int | None
    next: int | None


def page_of(sagas: list[Saga], asked: str) -> Shown:
    """The page `asked` (1 when it is none or past the end) of LIST_PAGE sagas."""
    pages = max(1, -(-len(sagas) // LIST_PAGE))
    number = int(asked) if asked.isdigit() and 1 <= int(asked) <= pages else 1
    start = (number - 1) * LIST_PAGE
    return Shown(
        sagas[start : start + LIST_PAGE],
        start + 1,
        len(sagas),
        number - 1 if number > 1 else None,
        number + 1 if number < pages else None,
    )


@page
async def history_page(current: Page) -> web.StreamResponse:
    """Archived sagas with the list's filters (and the archive's), a page at a time."""
    query = current.request.query
    filters = {k: query.get(k, "") for k in ("namespace", "phase", "org", "function", "since", "text")}
    try:
        since = now() - duration(filters["since"]) if filters["since"].strip() else None
        before = paging(query.get("before", ""))
    except ValueError as bad:
        return current.render("error.html", status=400, message=f"history: {bad}")
    listed = await current.inspector.history(
        filters["namespace"] or None,
        HistoryQuery(
            phase=filters["phase"] or None,
            org=filters["org"] or None,
            function=filters["function"] or None,
            since=since,
            text=filters["text"] or None,
            limit=HISTORY_PAGE,
            before=before,
        ),
    )
    older = None
    if listed.next_page is not None:
        at, uid = listed.next_page
        older = current.url("/history?") + urlencode(
            {**{k: v for k, v in filters.items() if v}, "before": f"{at.isoformat()}|{uid}"}
        )
    return current.render("history.html", sagas=listed.sagas, refused=listed.refused, filters=filters, older=older)


def paging(text: str) -> tuple[datetime, str] | None:
    """The `before` of a History page link: "<finished time>|<uid>"."""
    if not text:
        return None
    at, _, uid = text.partition("|")
    if not re.fullmatch(r"[0-9a-f-]{36}", uid):
        raise ValueError(f"{text[:80]!r} is not a page of the history")
    return datetime.fromisoformat(at), uid


@page
async def saga_page(current: Page) -> web.StreamResponse:
    namespace, name = current.request.match_info["namespace"], current.request.match_info["name"]
    detail = await current.inspector.show(namespace, name)
    saga = detail.saga
    skippable = {e.metadata.name for e in detail.entries if isinstance(resolutions.skip(saga, e), resolutions.Allowed)}
    anyway = {
        e.metadata.name for e in detail.entries if isinstance(resolutions.undo_anyway(saga, e), resolutions.Allowed)
    }
    conflicts = {e.metadata.name: found for e in detail.entries if (found := conflict_fields(e)) is not None}
    halted_on = resolutions.halted_on(saga, detail.entries)
    return current.render(
        "saga.html",
        detail=detail,
        saga=saga,
        skippable=skippable,
        undoable_anyway=anyway,
        conflicts=conflicts,
        can_retry=isinstance(resolutions.retry(saga), resolutions.Allowed),
        can_abort=isinstance(resolutions.abort(saga), resolutions.Allowed),
        # Rewind to a step: an Active saga, to any step but its newest (the shared rule decides on submit).
        rewind_to=[] if saga.status.phase != SagaPhase.ACTIVE else detail.entries[1:],
        halted_on=halted_on,
        waves=[] if saga.status.phase in TERMINAL else compensation_plan.waves(detail.entries),
        timeline=pictures.timeline(detail.entries, detail.events, started(detail)),
        graph=pictures.graph(detail.entries),
        events=current.url("/events?" + urlencode({"namespace": namespace, "saga": name})),
    )


def started(detail: SagaDetail) -> datetime:
    """The timeline's zero: the saga's creation, or its first call or Event if they came earlier
    (an archived saga's record, a clock apart)."""
    moments = [a.time for e in detail.entries for a in e.status.attempts]
    moments += [e.time for e in detail.events if e.time is not None]
    created = detail.saga.metadata.creation_timestamp or detail.saga.status.start_time
    return min([*moments, *([created] if created else [])], default=now())


@page
async def webhook_page(current: Page) -> web.StreamResponse:
    namespace, name = current.request.match_info["namespace"], current.request.match_info["name"]
    return current.render("webhook.html", webhook=await current.inspector.webhook(namespace, name))


# -- actions (forms with a reason; the operator stays the only writer of phases) ---------------------


Resolution = Callable[[str, str, int, str], Awaitable[UndoEntry]]  # namespace, saga, position, reason


def back(current: Page, notice: str) -> web.HTTPSeeOther:
    target = str(current.request.headers.get("Referer") or current.url("/"))
    base = target.split("?notice=", 1)[0].split("&notice=", 1)[0]
    return web.HTTPSeeOther(base + ("&" if "?" in base else "?") + urlencode({"notice": notice}))


async def reason_of(current: Page) -> str:
    reason = str((await current.request.post()).get("reason", "")).strip()
    if not reason:
        raise errors.CommandError("say why: the reason is kept on the saga with your name")
    return reason


@page
async def retry(current: Page) -> web.StreamResponse:
    namespace, name = current.request.match_info["namespace"], current.request.match_info["name"]
    await current.inspector.retry(namespace, name, await reason_of(current))
    raise back(current, f"retry requested for {namespace}/{name}")


@page
async def abort(current: Page) -> web.StreamResponse:
    namespace, name = current.request.match_info["namespace"], current.request.match_info["name"]
    await current.inspector.abort(namespace, name, await reason_of(current))
    raise back(current, f"{namespace}/{name} aborted: it will be compensated newest-first")


@page
async def rewind_saga(current: Page) -> web.StreamResponse:
    namespace, name = current.request.match_info["namespace"], current.request.match_info["name"]
    to = str((await current.request.post()).get("to", "")).strip()
    if not to.isdigit():
        raise errors.CommandError("choose the step to rewind to")
    asked = await current.inspector.rewind(namespace, name, int(to), await reason_of(current))
    raise back(
        current,
        f"rewind of {namespace}/{name} to position {asked.to_position} requested: the steps above it are undone",
    )


async def resolved(current: Page, resolve: Resolution, said: str) -> web.StreamResponse:
    """A person's resolution of the entry the URL names (its saga, its stack position), with a reason."""
    info = current.request.match_info
    entry = await resolve(info["namespace"], info["name"], int(info["position"]), await reason_of(current))
    raise back(current, f"{entry.metadata.name} {said}")


@page
async def skip(current: Page) -> web.StreamResponse:
    return await resolved(current, current.inspector.skip, "will be skipped; the saga then goes on")


@page
async def undo_anyway(current: Page) -> web.StreamResponse:
    return await resolved(current, current.inspector.undo_anyway, "will be undone anyway, overwriting the later change")


@page
async def retry_halted(current: Page) -> web.StreamResponse:
    form = await current.request.post()
    function = str(form.get("function", "")).strip()
    if not function:
        raise errors.CommandError("name the function that was fixed")
    namespace = str(form.get("namespace", "")) or None
    reason = await reason_of(current)
    sagas = await current.inspector.halted_on(function, namespace)
    results = await current.inspector.retry_all(sagas, reason)
    refused = [f"{s.reference}: {why}" for s, why in results if why]
    said = f"retry requested for {len(results) - len(refused)} saga(s) halted on {function}"
    if refused:
        said += "; refused: " + "; ".join(refused)
    raise back(current, said)


# -- live ----------------------------------------------------------------------------------------------


async def events(request: web.Request) -> web.StreamResponse:
    """Server-sent events: `change` whenever a saga in view changes (the page then reloads its
    live region), with the viewer's own watch permission."""
    kube = await request.app[VIEWERS].client(request)
    if kube is None:
        raise web.HTTPUnauthorized()
    namespace = request.query.get("namespace") or None
    name = request.query.get("saga") or None
    stream = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await stream.prepare(request)
    inspector = Inspector(kube)
    try:
        since = await inspector.current_version(namespace)
    except errors.KubeError as error:  # the API is down (a restart): the browser asks again in 2 s
        log.info("event stream not started: %s", error.message)
        await stream.write(b"retry: 2000\n\n")
        return stream
    # From here on no change is missed: the page may rely on what it shows (and tests wait for it).
    await stream.write(b"event: ready\ndata: {}\n\n")
    changes = inspector.changes(namespace, name, since)
    try:
        async for _ in keepalive(changes):
            await stream.write(b"event: change\ndata: {}\n\n" if _ else b": keepalive\n\n")
    except (ConnectionResetError, errors.KubeError) as error:
        log.debug("event stream ended: %s", error)
    return stream


async def keepalive(changes: AsyncIterator[Any]) -> AsyncIterator[bool]:
    """True for each change, False every KEEPALIVE_SECONDS of silence (so proxies keep it open)."""
    iterator = changes.__aiter__()
    pending: asyncio.Task[Any] | None = None
    try:
        while True:
            pending = pending or asyncio.ensure_future(iterator.__anext__())
            done, _ = await asyncio.wait({pending}, timeout=KEEPALIVE_SECONDS)
            if not done:
                yield False
                continue
            pending.result()
            pending = None
            yield True
    finally:
        if pending is not None:
            pending.cancel()


# -- signing in (token mode) ----------------------------------------------------------------------------


async def login_form(request: web.Request) -> web.StreamResponse:
    environment = request.app[TEMPLATES]
    body = environment.get_template("login.html").render(
        next=request.query.get("next", request.app[BASE] + "/"),
        error=request.query.get("error", ""),
        fragment=False,
        csrf="",
        viewer="",
        login=True,
        path=request.app[BASE] + "/login",
        notice="",
        history=request.app[ARCHIVE] is not None,
        base=request.app[BASE],
    )
    return web.Response(text=body, content_type="text/html")


def here(target: str, home: str = "/") -> str:
    """`target` if it is a page of this dashboard, else `home`: judged as the redirect will write it.
    A sign-in link's `next` is anyone's to choose, and yarl drops tabs and newlines, so "/\t/host"
    passed a check on the text as given and left as "//host": another site, with the viewer
    believing they had just signed in to this one."""
    try:
        written = str(URL(target))
    except ValueError:
        return home
    return written if written.startswith("/") and not written.startswith("//") else home


def signing_in(viewers: TokenViewers) -> Handler:
    async def login(request: web.Request) -> web.StreamResponse:
        """A pasted token is checked against the API (who is it?) before it is kept."""
        form = await request.post()
        token = str(form.get("token", "")).strip()
        base = request.app[BASE]
        target = here(str(form.get("next", "/")), base + "/")
        kube = Kube.with_token(viewers.server, viewers.ca_file, token)
        try:
            await kube.whoami()
        except errors.KubeError as refused:
            raise web.HTTPSeeOther(base + "/login?" + urlencode({"next": target, "error": refused.message})) from None
        finally:
            await kube.close()
        response = web.HTTPSeeOther(target)
        response.set_cookie(
            TOKEN_COOKIE, token, httponly=True, samesite="Strict", secure=request.secure, path=base + "/"
        )
        raise response

    return login


async def logout(request: web.Request) -> web.StreamResponse:
    response = web.HTTPSeeOther(request.app[BASE] + "/login")
    response.del_cookie(TOKEN_COOKIE, path=request.app[BASE] + "/")
    raise response


async def healthz(request: web.Request) -> web.StreamResponse:
    return web.Response(text="ok")


async def home(request: web.Request) -> web.StreamResponse:
    raise web.HTTPSeeOther(request.app[BASE] + "/sagas")


ENTRY = "/sagas/{namespace}/{name}/entries/{position:[0-9]{1,10}}"  # an entry's actions, by its stack position


def application(
    viewers: Viewers, archive: ArchiveStore | None = None, hosts: frozenset[str] | None = None, base: str = ""
) -> web.Application:
    """`hosts`: the Host names it answers to (None: any); see dashboard.guards. `base`: the path
    prefix every page is served under (behind a proxy that passes the path on as it came); the
    health check stays at /healthz for probes."""
    app = web.Application(middlewares=[guarded(hosts)])
    app.on_response_prepare.append(send_security_headers)
    app[VIEWERS] = viewers
    app[ARCHIVE] = archive
    app[TEMPLATES] = templates()
    app[BASE] = base
    static = resources.files("undolog.dashboard") / "static"
    app.add_routes(
        [
            web.get("/healthz", healthz),
            web.get(f"{base}/", home),
            web.get(f"{base}/overview", overview_page),
            web.get(f"{base}/sagas", saga_list),
            web.get(f"{base}/sagas/{{namespace}}/{{name}}", saga_page),
            web.get(f"{base}/history", history_page),
            web.post(f"{base}/sagas/{{namespace}}/{{name}}/retry", retry),
            web.post(f"{base}/sagas/{{namespace}}/{{name}}/abort", abort),
            web.post(f"{base}/sagas/{{namespace}}/{{name}}/rewind", rewind_saga),
            web.post(f"{base}{ENTRY}/skip", skip),
            web.post(f"{base}{ENTRY}/undo-anyway", undo_anyway),
            web.post(f"{base}/retry-halted", retry_halted),
            web.get(f"{base}/webhooks/{{namespace}}/{{name}}", webhook_page),
            web.get(f"{base}/events", events),
            web.static(f"{base}/static", str(static)),
        ]
    )
    if isinstance(viewers, TokenViewers) and viewers.login:
        app.add_routes(
            [
                web.get(f"{base}/login", login_form),
                web.post(f"{base}/login", signing_in(viewers)),
                web.post(f"{base}/logout", logout),
            ]
        )
    if base:
        app.add_routes([web.get(base, home)])

    async def open_archive(_: web.Application) -> None:
        if archive is not None:
            await archive.open()

    async def close(_: web.Application) -> None:
        await viewers.close()
        if archive is not None:
            await archive.close()

    app.on_startup.append(open_archive)
    app.on_cleanup.append(close)
    return app


def serve(
    viewers: Viewers,
    host: str,
    port: int,
    archive: ArchiveStore | None = None,
    allowed: Collection[str] = (),
    base: str = "",
) -> None:
    # Live pages hold a connection open for good: a stop closes them after a moment, not a minute.
    web.run_app(
        application(viewers, archive, allowed_hosts(host, allowed), base),
        host=host,
        port=port,
        shutdown_timeout=1.0,
        print=lambda text: log.info("%s", text),
    )
