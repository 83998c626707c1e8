"""Three small real HTTP services for the onboarding demo, each on its own port.

identity: users. Refuses (409) to delete a user who still has permissions, so undo order matters.
authorization: permissions per user.
email: an outbox; `--slow-send` makes sending take longer than the agent waits (the email
still goes out: the caller's timeout says nothing about the effect), and recall undoes it.

Every POST honours Idempotency-Key: the same key gets the same answer and no second effect.
Compensations find the effect through Undolog-Forward-Key when their arguments cannot, and a
forward call that arrives after its compensation (a request held by a proxy, processed late) is
refused 410 and never applied (the late-forward rule).
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import urllib.request
import zlib
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Reply = tuple[int, dict[str, Any]]
Route = Callable[[dict[str, Any], dict[str, str]], Reply]


class Service:
    """An HTTP service with POST routes, idempotent by key, and GET /state."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.lock = threading.RLock()
        # A forward call, its repeats and its compensations take turns (a lock striped by the
        # forward key): a repeat waits for the first's answer instead of making a second effect,
        # and a compensation for the forward call it races. Other keys go on meanwhile.
        self.turns = [threading.Lock() for _ in range(64)]
        self.routes: dict[str, Route] = {}
        self.replies: dict[str, Reply] = {}  # Idempotency-Key -> the first answer
        self.compensated: set[str] = set()  # forward keys a compensation named: never applied after it
        self.calls: list[str] = []

    def state(self) -> dict[str, Any]:
        raise NotImplementedError

    def handle(self, path: str, body: dict[str, Any], headers: dict[str, str]) -> Reply:
        key, undoes = headers.get("idempotency-key", ""), headers.get("undolog-forward-key")
        with self.turns[zlib.crc32((undoes or key).encode()) % len(self.turns)]:
            return self._handled(path, key, undoes, body, headers)

    def _handled(self, path: str, key: str, undoes: str | None, body: dict[str, Any], headers: dict[str, str]) -> Reply:
        with self.lock:
            if key and key in self.replies:
                self.calls.append(f"{path} (replayed {key})")
                return self.replies[key]
            if undoes:
                self.compensated.add(undoes)
            elif key in self.compensated:  # its compensation came first: never applied now
                self.calls.append(f"{path} -> 410 (compensated before it arrived)")
                return 410, {"error": f"{key} was compensated before it arrived: not applied"}
        route = self.routes.get(path)
        if route is None:
            return 404, {"error": f"{self.name} has no {path}"}
        status, reply = route(body, headers)
        with self.lock:
            self.calls.append(f"{path} -> {status}")
            if key and status < 500:  # a server error may be retried for real
                self.replies.setdefault(key, (status, reply))
            return self.replies.get(key, (status, reply))

    def serve(self, port: int, host: str = "127.0.0.1") -> ThreadingHTTPServer:
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] == "/state":
                    with service.lock:
                        self._send(200, {**service.state(), "calls": service.calls})
                else:
                    self._send(*service.get(self.path))

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = json.loads(raw) if raw else {}
                self._send(*service.handle(self.path, body, {k.lower(): v for k, v in self.headers.items()}))

            def _send(self, status: int, body: dict[str, Any]) -> None:
                payload = json.dumps(body).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, *_: Any) -> None:
                pass

        class Server(ThreadingHTTPServer):
            request_queue_size = 128  # the standard library's 5 resets connections when many calls come at once

        server = Server((host, port), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server

    def get(self, path: str) -> Reply:
        return 404, {"error": f"{self.name} has no GET {path}"}


class Identity(Service):
    def __init__(self, authorization_url: str) -> None:
        super().__init__("identity")
        self.authorization_url = authorization_url
        self.users: dict[str, dict[str, Any]] = {}
        self.created_by: dict[str, str] = {}  # forward key -> user id
        self.routes = {"/users": self.create, "/users/delete": self.delete}

    def state(self) -> dict[str, Any]:
        return {"users": self.users}

    def create(self, body: dict[str, Any], headers: dict[str, str]) -> Reply:
        with self.lock:
            user_id = f"u-{len(self.created_by) + 1}"
            self.users[user_id] = {"email": body.get("email")}
            self.created_by[headers.get("idempotency-key", user_id)] = user_id
        return 200, {"user_id": user_id}

    def delete(self, body: dict[str, Any], headers: dict[str, str]) -> Reply:
        user_id = body.get("user_id") or self.created_by.get(headers.get("undolog-forward-key", ""))
        if user_id is None or user_id not in self.users:
            return 200, {"deleted": False, "note": "no such user: nothing to undo"}
        with urllib.request.urlopen(f"{self.authorization_url}/permissions?user_id={user_id}", timeout=5) as answer:
            if json.load(answer)["roles"]:
                return 409, {"error": f"user {user_id} still has permissions; revoke them first"}
        with self.lock:
            del self.users[user_id]
        return 200, {"deleted": True}


class Authorization(Service):
    def __init__(self) -> None:
        super().__init__("authorization")
        self.roles: dict[str, list[str]] = {}
        self.routes = {"/permissions/assign": self.assign, "/permissions/revoke": self.revoke}

    def state(self) -> dict[str, Any]:
        return {"permissions": {user: roles for user, roles in self.roles.items() if roles}}

    def get(self, path: str) -> Reply:
        user_id = path.partition("user_id=")[2]
        with self.lock:
            return 200, {"user_id": user_id, "roles": self.roles.get(user_id, [])}

    def assign(self, body: dict[str, Any], _: dict[str, str]) -> Reply:
        with self.lock:
            self.roles.setdefault(body["user_id"], []).extend(body.get("roles", []))
        return 200, {"user_id": body["user_id"], "roles": self.roles[body["user_id"]]}

    def revoke(self, body: dict[str, Any], _: dict[str, str]) -> Reply:
        with self.lock:
            revoked = self.roles.pop(body.get("user_id") or "", [])
        return 200, {"revoked": revoked}


class Email(Service):
    def __init__(self, slow_send_seconds: float) -> None:
        super().__init__("email")
        self.slow_send_seconds = slow_send_seconds
        self.outbox: dict[str, dict[str, Any]] = {}  # forward key -> message
        self.recalled: list[str] = []
        self.routes = {"/emails/send": self.send, "/emails/recall": self.recall}

    def state(self) -> dict[str, Any]:
        return {"delivered": list(self.outbox.values()), "recalled": self.recalled}

    def send(self, body: dict[str, Any], headers: dict[str, str]) -> Reply:
        with self.lock:
            self.outbox[headers.get("idempotency-key", "")] = {"to": body.get("to"), "template": body.get("template")}
        time.sleep(self.slow_send_seconds)  # the email went out; the answer is late
        return 200, {"queued": True}

    def recall(self, _: dict[str, Any], headers: dict[str, str]) -> Reply:
        key = headers.get("undolog-forward-key", "")
        with self.lock:
            message = self.outbox.pop(key, None)
            if message:
                self.recalled.append(message["to"])
        return 200, {"recalled": message is not None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--identity-port", type=int, required=True)
    parser.add_argument("--authorization-port", type=int, required=True)
    parser.add_argument("--email-port", type=int, required=True)
    parser.add_argument("--slow-send", type=float, default=0.0, help="seconds the email provider takes to answer")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 in a pod)")
    options = parser.parse_args()
    Authorization().serve(options.authorization_port, options.host)
    Identity(f"http://127.0.0.1:{options.authorization_port}").serve(options.identity_port, options.host)
    Email(options.slow_send).serve(options.email_port, options.host)
    print("services ready", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
