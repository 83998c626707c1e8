"""A small issue tracker as a real MCP server (the `mcp` package's, streamable HTTP on loopback,
in a thread of the test process): tools whose effects a test can inspect.

- create_issue(title, fail=False): opens an issue; with `fail` it opens it and then answers
  isError (a partial effect: the number comes back in structuredContent all the same); a title
  that starts `refused:` is refused with a JSON-RPC error, nothing opened.
- close_issue(number): closes it; every close is recorded with the Idempotency-Key it came
  under (`_meta` and header). `Issues.faults` scripts its next answers: "slow" (answered after
  SLOW_SECONDS), "huge" (a HUGE_BYTES text), "error" (isError, nothing closed), "refused" (a
  JSON-RPC invalid-params error, nothing closed), "internal" (a JSON-RPC internal error).
- close_issues_titled(title): closes the open issues of that title (an undo that needs only the
  call's arguments), recorded as close_issue's are.
- `Issues.answer`: while cleared, create_issue opens its issue and then waits to answer until
  it is set (a call whose effect happened and whose answer has not come back yet).
- file_issues(titles) -> {issues: [{number, title}]}, close_issues(numbers): an undo that needs a
  projection of the result (the numbers it opened); retitle_issue(number, title) with the
  read-only get_issue(number): an undo that needs the title from before the call.
- label_issue(number, label): changes state, mapped by no test configuration (refused).
- list_issues(): read-only (`readOnlyHint`).
- create_assigned_issue(title): opens an issue owned by whoever the user names when asked (on
  2026-07-28 an `input_required` result, then the client's retry; on a session, elicitation
  mid-call); nothing is opened before the answer.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import mcp_types as types
import uvicorn
from mcp.server.mcpserver import Context, Elicit, MCPServer, Resolve
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel
from starlette.types import ASGIApp, Receive, Scope, Send

KEY_META = "io.undolog/idempotency-key"
SLOW_SECONDS = 4.0
HUGE_BYTES = 48 * 1024 * 1024


class FiledIssue(BaseModel):
    number: int
    title: str


class FiledIssues(BaseModel):
    issues: list[FiledIssue]


class Assignee(BaseModel):
    name: str


def ask_assignee() -> Elicit[Assignee]:
    return Elicit("Who should own this issue?", Assignee)


@dataclass(frozen=True)
class Close:
    number: int
    meta_key: str | None
    header_key: str | None


def answering() -> threading.Event:
    answer = threading.Event()
    answer.set()
    return answer


@dataclass
class Issues:
    opened: dict[int, dict[str, Any]] = field(default_factory=dict)
    created_keys: list[str | None] = field(default_factory=list)
    closes: list[Close] = field(default_factory=list)
    faults: list[str] = field(default_factory=list)
    authorizations: list[str | None] = field(default_factory=list)  # each HTTP request's Authorization header
    answer: threading.Event = field(default_factory=answering)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def open(self, title: str) -> int:
        with self.lock:
            number = len(self.opened) + 1
            self.opened[number] = {"number": number, "title": title, "state": "open"}
            return number

    def next_fault(self) -> str | None:
        with self.lock:
            return self.faults.pop(0) if self.faults else None

    def state(self, number: int) -> str:
        with self.lock:
            return str(self.opened[number]["state"])


def keys_of(ctx: Context) -> tuple[str | None, str | None]:
    meta = ctx.request_context.meta or {}
    headers = ctx.headers or {}
    key = meta.get(KEY_META) if isinstance(meta, dict) else getattr(meta, KEY_META, None)
    return (str(key) if key else None), headers.get("idempotency-key")


def said(text: str, is_error: bool = False, **structured: Any) -> types.CallToolResult:
    content: list[types.ContentBlock] = [types.TextContent(type="text", text=text)]
    return types.CallToolResult(content=content, structured_content=structured or None, is_error=is_error)


def tracker(issues: Issues) -> MCPServer:
    server = MCPServer("tracker", log_level="WARNING")  # its INFO lines (per request) drown a test's output

    @server.tool()
    async def create_issue(title: str, ctx: Context, fail: bool = False) -> types.CallToolResult:
        """Open an issue."""
        if title.startswith("refused:"):  # a JSON-RPC error before anything is opened
            raise MCPError(types.INVALID_PARAMS, f"no issue titled {title!r} may be opened: the board is frozen")
        with issues.lock:
            number = len(issues.opened) + 1
            issues.opened[number] = {"number": number, "title": title, "state": "open"}
            issues.created_keys.append(keys_of(ctx)[0])
        if not issues.answer.is_set():
            await asyncio.to_thread(issues.answer.wait, 60)
        text = f"label service down after opening #{number}" if fail else f"opened #{number}"
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=text)], structured_content={"number": number}, is_error=fail
        )

    @server.tool()
    def create_assigned_issue(
        title: str, assignee: Annotated[Assignee, Resolve(ask_assignee)], ctx: Context
    ) -> types.CallToolResult:
        """Open an issue owned by whoever the user names."""
        number = issues.open(title)
        with issues.lock:
            issues.opened[number]["assignee"] = assignee.name
            issues.created_keys.append(keys_of(ctx)[0])
        return said(f"opened #{number} for {assignee.name}", number=number)

    @server.tool()
    async def close_issue(number: int, ctx: Context) -> types.CallToolResult:
        """Close an issue."""
        fault = issues.next_fault()
        if fault == "error":
            return said("the tracker is read-only today", is_error=True)
        if fault == "refused":  # a JSON-RPC error, as servers that raise instead of answering isError
            raise MCPError(types.INVALID_PARAMS, f"issue #{number} is locked: AlreadyExists")
        if fault == "internal":
            raise MCPError(types.INTERNAL_ERROR, "the tracker's database is restarting")
        if fault == "huge":
            return said("x" * HUGE_BYTES)
        if fault == "slow":
            await asyncio.sleep(SLOW_SECONDS)
        with issues.lock:
            issues.opened[number]["state"] = "closed"
            issues.closes.append(Close(number, *keys_of(ctx)))
        return said(f"closed #{number}", number=number, state="closed")

    @server.tool()
    def close_issues_titled(title: str, ctx: Context) -> types.CallToolResult:
        """Close the open issues of this title."""
        with issues.lock:
            numbers = [n for n, i in issues.opened.items() if i["title"] == title and i["state"] == "open"]
            for number in numbers:
                issues.opened[number]["state"] = "closed"
                issues.closes.append(Close(number, *keys_of(ctx)))
        return said(f"closed {numbers}", closed=numbers)

    @server.tool()
    def label_issue(number: int, label: str) -> str:
        """Label an issue."""
        with issues.lock:
            issues.opened[number].setdefault("labels", []).append(label)
        return "labelled"

    @server.tool()
    def file_issues(titles: list[str], ctx: Context) -> FiledIssues:
        """Open an issue per title (the undo needs the numbers it opened: a projection of its result)."""
        filed = [FiledIssue(number=issues.open(title), title=title) for title in titles]
        with issues.lock:
            issues.created_keys.append(keys_of(ctx)[0])
        return FiledIssues(issues=filed)

    @server.tool()
    def close_issues(numbers: list[int], ctx: Context) -> types.CallToolResult:
        """Close these issues."""
        with issues.lock:
            for number in numbers:
                issues.opened[number]["state"] = "closed"
                issues.closes.append(Close(number, *keys_of(ctx)))
        return said(f"closed {numbers}", closed=numbers)

    @server.tool()
    def retitle_issue(number: int, title: str) -> str:
        """Give an issue another title (its undo needs the title from before: a before-image)."""
        with issues.lock:
            issues.opened[number]["title"] = title
        return "retitled"

    @server.tool(annotations=types.ToolAnnotations(read_only_hint=True))
    def get_issue(number: int) -> FiledIssue:
        """One issue as it is now."""
        with issues.lock:
            issue = issues.opened.get(number)
        if issue is None:
            raise ValueError(f"no issue #{number}")
        return FiledIssue(number=number, title=str(issue["title"]))

    @server.resource("tracker://issues/{number}")
    def issue(number: str) -> str:
        """One issue as text (a resource, passed through by the gateway)."""
        with issues.lock:
            found = issues.opened.get(int(number))
        return f"#{number} {found['title']} ({found['state']})" if found else f"no issue #{number}"

    @server.resource("tracker://about")
    def about() -> str:
        """What this tracker is."""
        return "a small issue tracker for UndoLog's tests"

    @server.prompt()
    def triage(number: str) -> str:
        """A prompt to triage an issue."""
        return f"Triage issue #{number}: label it, or close it if it is a duplicate."

    @server.tool(annotations=types.ToolAnnotations(read_only_hint=True))
    def list_issues() -> str:
        """Every issue and its state."""
        with issues.lock:
            return ", ".join(f"#{n} {i['state']}" for n, i in issues.opened.items()) or "none"

    return server


Accepts = Callable[[str | None], Awaitable[bool]]  # whether a request's Authorization header lets it in


def guarded(app: ASGIApp, issues: Issues, accepts: Accepts | None) -> ASGIApp:
    """The app, each request's Authorization header recorded, and refused 401 unless `accepts` it."""

    async def served(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            said = dict(scope["headers"]).get(b"authorization")
            issues.authorizations.append(said.decode() if said else None)
            if accepts is not None and not await accepts(said.decode() if said else None):
                await send({"type": "http.response.start", "status": 401, "headers": []})
                await send({"type": "http.response.body", "body": b"the tracker's own token is required"})
                return
        await app(scope, receive, send)

    return served


def bearing(token: str) -> Accepts:
    async def accepts(said: str | None) -> bool:
        return said == f"Bearer {token}"

    return accepts


class Tracker:
    """The tracker served on a free loopback port until `stop`; with `token`, only to requests
    that bear it, with `accepts`, to those it lets in."""

    def __init__(self, token: str | None = None, accepts: Accepts | None = None, tls: Path | None = None) -> None:
        """`tls`: a folder with tracker.crt, tracker.key and ca.crt: served over TLS, to clients
        whose certificate that authority signed (and to no other)."""
        self.issues = Issues()
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        app = guarded(tracker(self.issues).streamable_http_app(), self.issues, bearing(token) if token else accepts)
        secured: dict[str, Any] = {}
        if tls is not None:
            secured = {
                "ssl_certfile": str(tls / "tracker.crt"),
                "ssl_keyfile": str(tls / "tracker.key"),
                "ssl_ca_certs": str(tls / "ca.crt"),
                "ssl_cert_reqs": ssl.CERT_REQUIRED,
            }
        self.scheme = "https" if tls is not None else "http"
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", **secured)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=lambda: asyncio.run(self._server.serve()), daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the tracker did not start within 10 s")
            time.sleep(0.02)

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}/mcp"

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(10)


if __name__ == "__main__":  # the tracker as a local MCP server over stdio (an upstream `command`)
    tracker(Issues()).run("stdio")
