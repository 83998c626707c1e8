"""The onboarding agent: three tool calls, each registered with UndoLog before it runs.

create_user -> assign_permissions -> send_welcome_email. If any call fails (here the email
provider answers too late), the exception leaves the saga block, the SDK aborts the saga, and
the operator undoes what ran, newest first: recall the email, revoke, delete the user.
"""

from __future__ import annotations

import argparse
import asyncio

import httpx

from undolog.sdk import Call, open_saga


async def onboard(
    email: str, *, identity: str, authorization: str, mailer: str, namespace: str, call_seconds: float = 2.0
) -> str:
    """Run the onboarding saga; returns its name. Raises what the failing tool raised."""
    saga = await open_saga(generate_name="onboard-", namespace=namespace, org="acme", deadline_seconds=300)
    async with saga, httpx.AsyncClient(timeout=call_seconds) as http:
        print(f"saga {saga.namespace}/{saga.name} opened", flush=True)
        undo_user = Call(function="delete-user", args={"user_id": "${steps.create_user.output.user_id}"})
        async with saga.step("create_user", compensation=undo_user) as step:
            answer = await http.post(
                f"{identity}/users", json={"email": email}, headers={"Idempotency-Key": step.forward_key}
            )
            answer.raise_for_status()
            step.output = answer.json()
        user_id = step.output["user_id"]
        print(f"  create_user        -> {user_id}", flush=True)

        async with saga.step(
            "assign_permissions", compensation=Call(function="revoke-permissions", args={"user_id": user_id})
        ) as step:
            answer = await http.post(
                f"{authorization}/permissions/assign",
                json={"user_id": user_id, "roles": ["reader", "billing"]},
                headers={"Idempotency-Key": step.forward_key},
            )
            answer.raise_for_status()
            step.output = answer.json()
        print(f"  assign_permissions -> {step.output['roles']}", flush=True)

        async with saga.step(
            "send_welcome_email", compensation=Call(function="recall-email", args={"to": email})
        ) as step:
            print("  send_welcome_email ...", flush=True)
            answer = await http.post(
                f"{mailer}/emails/send",
                json={"to": email, "template": "welcome"},
                headers={"Idempotency-Key": step.forward_key},
            )
            answer.raise_for_status()
        print("  send_welcome_email -> sent", flush=True)
    return saga.name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    for flag in ("--identity", "--authorization", "--mailer", "--email"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--namespace", default="default")
    options = parser.parse_args()
    asyncio.run(
        onboard(
            options.email,
            identity=options.identity,
            authorization=options.authorization,
            mailer=options.mailer,
            namespace=options.namespace,
        )
    )


if __name__ == "__main__":
    main()
