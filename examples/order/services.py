"""A shop for the order example, as one small real HTTP service: stock, payments, email and the
warehouse. The first confirmation email fails (503) to show a Retriable step going forward.

    python -m examples.order.services --port 8110 &
    kubectl apply -n <namespace> -f examples/order/webhooks.yaml -f examples/order/saga.yaml
    kubectl get saga order-1042 -n <namespace>        # Completed; GET :8110/state shows what happened

Every POST honours Idempotency-Key (examples.onboarding.services.Service).
"""

from __future__ import annotations

import argparse
import threading
from typing import Any

from examples.onboarding.services import Reply, Service


class Shop(Service):
    def __init__(self) -> None:
        super().__init__("shop")
        self.reserved: dict[str, dict[str, Any]] = {}
        self.authorized: dict[str, dict[str, Any]] = {}
        self.captured: list[str] = []
        self.emails = 0
        self.notified: list[str] = []
        self.routes = {
            "/stock/reserve": self.reserve,
            "/stock/release": self.release,
            "/payments/authorize": self.authorize,
            "/payments/void": self.void,
            "/payments/capture": self.capture,
            "/emails/send": self.send,
            "/warehouse/notify": self.notify,
        }

    def state(self) -> dict[str, Any]:
        return {
            "reserved": self.reserved,
            "authorized": self.authorized,
            "captured": self.captured,
            "notified": self.notified,
        }

    def reserve(self, body: dict[str, Any], _: dict[str, str]) -> Reply:
        with self.lock:
            reservation = f"res-{len(self.reserved) + 1}"
            self.reserved[reservation] = body
        return 200, {"reservation_id": reservation}

    def release(self, body: dict[str, Any], _: dict[str, str]) -> Reply:
        with self.lock:
            released = self.reserved.pop(body.get("reservation") or "", None)
        return 200, {"released": released is not None}

    def authorize(self, body: dict[str, Any], _: dict[str, str]) -> Reply:
        with self.lock:
            authorization = f"auth-{len(self.authorized) + 1}"
            self.authorized[authorization] = body
        return 200, {"authorization_id": authorization}

    def void(self, body: dict[str, Any], _: dict[str, str]) -> Reply:
        with self.lock:
            voided = self.authorized.pop(body.get("authorization") or "", None)
        return 200, {"voided": voided is not None}

    def capture(self, body: dict[str, Any], _: dict[str, str]) -> Reply:
        with self.lock:
            self.captured.append(str(body.get("authorization")))
        return 200, {"captured": True}

    def send(self, body: dict[str, Any], _: dict[str, str]) -> Reply:
        with self.lock:
            self.emails += 1
            if self.emails == 1:
                return 503, {"error": "mail relay busy"}
        return 200, {"queued": True}

    def notify(self, body: dict[str, Any], _: dict[str, str]) -> Reply:
        with self.lock:
            self.notified.append(str(body.get("reservation")))
        return 200, {"notified": True}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=8110)
    Shop().serve(parser.parse_args().port)
    print("shop ready", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
