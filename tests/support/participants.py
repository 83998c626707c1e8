"""Real HTTP participants on loopback that record every request and answer by script.

A participant is a ThreadingHTTPServer in the test process: the operator (a separate
process) calls it over TCP exactly as it would call a real service.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import dataclasses
import json
import socket
import ssl
import struct
import sys
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

if TYPE_CHECKING:
    from devtools.control_plane.pki import Issued


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: Any
    at: float  # time.monotonic() when the request arrived (its body read)
    replied: int = 0  # the status answered; 0 for a connection reset without an answer
    began: float = 0.0  # time.monotonic() when its request line and headers had been read
    raw: str = ""  # the body as it came (what a signature covers)

    @property
    def key(self) -> str:
        return self.headers.get("idempotency-key", "")


@dataclass(frozen=True)
class Reply:
    status: int = 200
    body: Any = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0  # seconds before answering (longer than the timeout: a timeout)
    reset: bool = False  # close the connection with a TCP reset instead of answering
    raw: bytes | None = None  # a body sent as is (garbage), instead of `body` as JSON
    drip: float | None = None  # send the headers, then one byte every `drip` seconds, forever
    size: int | None = None  # a JSON answer of this many bytes, written in chunks (never held whole)


Handler = Callable[[Received], Reply]


class _Server(ThreadingHTTPServer):
    request_queue_size = 1024  # hundreds of concurrent callers must not be refused at connect

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A caller that hangs up (a killed operator, a client timeout) is expected; only
        # anything else is worth a traceback.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class Participant:
    def __init__(self, tls: ssl.SSLContext | None = None, port: int = 0, reports: bool = False) -> None:
        self.reports = reports
        self._lock = threading.Condition()
        self._received: list[Received] = []
        self._scripts: dict[str, deque[Reply]] = defaultdict(deque)
        self._handlers: dict[str, Handler] = {}
        self._compensated: set[str] = set()  # forward keys a compensation named
        self._applied: set[str] = set()  # forward keys answered 2xx
        participant = self

        class RequestHandler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as real services do
            disable_nagle_algorithm = True  # or keep-alive answers wait out delayed ACKs (40 ms)

            def do_GET(self) -> None:
                # Only a participant serving in its own process (benchmarks) reports this way.
                # `?from=N`: the requests received after the first N. A benchmark polls this every
                # second; the whole list, 30,000 requests at 10,000 sagas, took the participant's
                # CPU from the calls it answers (and made polling quadratic).
                url = urlsplit(self.path)
                if url.path != "/_received" or not participant.reports:
                    self.send_error(404)
                    return
                start = int(parse_qs(url.query).get("from", ["0"])[0])
                payload = json.dumps([dataclasses.asdict(r) for r in participant.received_since(start)]).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def do_POST(self) -> None:
                began = time.monotonic()
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                if len(raw) < length:  # the caller stopped mid-request: no service acts on half a request
                    self.close_connection = True
                    return
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = raw.decode(errors="replace")
                headers = {k.lower(): v for k, v in self.headers.items()}
                request = Received(
                    self.path, headers, body, time.monotonic(), began=began, raw=raw.decode(errors="replace")
                )
                reply = participant._answer(request)
                if reply.delay:
                    time.sleep(reply.delay)
                if reply.reset:
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.close_connection = True
                    return
                if reply.drip is not None or reply.size is not None:
                    self._stream(reply)
                    return
                payload = reply.raw if reply.raw is not None else json.dumps(reply.body).encode()
                try:
                    self.send_response(reply.status)
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    if "content-type" not in {name.lower() for name in reply.headers}:
                        self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the caller timed out and went away

            def _stream(self, reply: Reply) -> None:
                """A hostile answer: endless one-byte trickle, or a huge body in 1 MiB chunks."""
                self.close_connection = True
                try:
                    self.send_response(reply.status)
                    self.send_header("Content-Type", "application/json")
                    if reply.size is not None:
                        self.send_header("Content-Length", str(reply.size))
                    self.end_headers()
                    if reply.drip is not None:
                        self.wfile.flush()
                        while True:
                            self.wfile.write(b" ")
                            self.wfile.flush()
                            time.sleep(reply.drip)
                    assert reply.size is not None
                    chunk = b" " * (1 << 20)
                    self.wfile.write(b"{")
                    left = reply.size - 2
                    while left > 0:
                        self.wfile.write(chunk[: min(left, len(chunk))])
                        left -= len(chunk)
                    self.wfile.write(b"}")
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the caller hung up: what a bounded caller does

            def log_message(self, *_: Any) -> None:
                pass

        self._handler, self._tls = RequestHandler, tls
        self.scheme = "http" if tls is None else "https"
        self._serve(port)

    def _serve(self, port: int) -> None:
        self._server = _Server(("127.0.0.1", port), self._handler)
        self._server.daemon_threads = True
        self._port = int(self._server.server_address[1])  # kept for `up`, whatever the first was
        if self._tls is not None:
            self._server.socket = self._tls.wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def down(self) -> None:
        """Stop listening: connections to its port are refused (a service that went away)."""
        self._server.shutdown()
        self._server.server_close()

    def up(self) -> None:
        """Listen again on the same port."""
        self._serve(self.port)

    @property
    def port(self) -> int:
        return self._port

    def url(self, path: str) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}{path}"

    def script(self, path: str, *replies: Reply | int) -> None:
        """Answer the next requests to `path` with these replies, then 200 {} (or the handler)."""
        with self._lock:
            self._scripts[path].extend(r if isinstance(r, Reply) else Reply(r) for r in replies)

    def handle(self, path: str, handler: Handler) -> None:
        """Answer requests to `path` (once its script is used up) with `handler`."""
        self._handlers[path] = handler

    def _answer(self, request: Received) -> Reply:
        with self._lock:
            undoes = request.headers.get("undolog-forward-key")
            if undoes:
                self._compensated.add(undoes)
            elif request.key in self._compensated and request.key not in self._applied:
                # The late-forward rule: a forward call whose compensation came first is never applied.
                late = Reply(410, {"error": f"{request.key} was compensated before it arrived: not applied"})
                self._received.append(dataclasses.replace(request, replied=410))
                self._lock.notify_all()
                return late
            script = self._scripts.get(request.path)
            scripted = script.popleft() if script else None
        handler = self._handlers.get(request.path)
        reply = scripted or (handler(request) if handler else Reply())
        with self._lock:
            self._received.append(dataclasses.replace(request, replied=0 if reply.reset else reply.status))
            if not undoes and 200 <= reply.status < 300 and not reply.reset:
                self._applied.add(request.key)
            self._lock.notify_all()
        return reply

    def received(self, path: str | None = None) -> list[Received]:
        with self._lock:
            return [r for r in self._received if path is None or r.path == path]

    def received_since(self, start: int) -> list[Received]:
        """The requests received after the first `start`, in order."""
        with self._lock:
            return self._received[start:]

    def wait_for(self, predicate: Callable[[list[Received]], bool], timeout: float = 30.0) -> list[Received]:
        """Block until `predicate(all received)` holds; fail the test after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while not predicate(self._received):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"participant: condition not met in {timeout} s; received {self._summary()}")
                self._lock.wait(remaining)
            return list(self._received)

    async def until(self, predicate: Callable[[list[Received]], bool], within: float = 30.0) -> list[Received]:
        """`wait_for` without blocking the test's event loop."""
        return await asyncio.to_thread(self.wait_for, predicate, within)

    def _summary(self) -> list[tuple[str, str]]:
        return [(r.path, r.key) for r in self._received]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class AtMost:
    """A participant's own limit: answers 429 to a call that would make more than `per_second`
    in the last second."""

    def __init__(self, per_second: int) -> None:
        self.per_second = per_second
        self.recent: deque[float] = deque()
        self.refused = 0
        self.lock = threading.Lock()

    def __call__(self, request: Received) -> Reply:
        with self.lock:
            while self.recent and request.at - self.recent[0] >= 1.0:
                self.recent.popleft()
            if len(self.recent) >= self.per_second:
                self.refused += 1
                return Reply(429, {"error": "over the limit"}, headers={"Retry-After": "1"})
            self.recent.append(request.at)
        return Reply(200, {"refunded": True})


def most_in_one_second(times: list[float]) -> int:
    times, most, start = sorted(times), 0, 0
    for end, at in enumerate(times):
        while at - times[start] >= 1.0:
            start += 1
        most = max(most, end - start + 1)
    return most


class HttpsParticipant(Participant):
    """A participant serving HTTPS with a certificate from a CA of its own (files in `scratch`);
    `serve` changes the certificate the next connections get (an expired one, another name's,
    another CA's, and back), as a participant's certificate rotation does."""

    def __init__(self, scratch: Path) -> None:
        from devtools.control_plane.pki import certificate_authority, serving_certificate

        self.scratch = scratch
        self.ca = certificate_authority("participant-ca")
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.serve(serving_certificate(self.ca, "participant"))
        super().__init__(tls=self.context)

    @property
    def bundle(self) -> str:
        """The CA as a Webhook's `caBundle` holds it (base64 PEM)."""
        return base64.b64encode(self.ca.certificate_pem).decode()

    def serve(self, issued: Issued) -> None:
        (self.scratch / "tls.crt").write_bytes(issued.certificate_pem)
        (self.scratch / "tls.key").write_bytes(issued.key_pem)
        self.context.load_cert_chain(self.scratch / "tls.crt", self.scratch / "tls.key")


def https_participant(scratch: Path) -> tuple[Participant, str]:
    """An HttpsParticipant and its CA as a Webhook's `caBundle` holds it."""
    participant = HttpsParticipant(scratch)
    return participant, participant.bundle


def main() -> None:
    """A participant in a process of its own, so a benchmark's client does not share its GIL."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--port", type=int, required=True)
    participant = Participant(port=parser.parse_args().port, reports=True)
    print(f"participant on {participant.port}", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
