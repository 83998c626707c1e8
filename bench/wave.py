"""The wave of an incident: N sagas of 3 entries aborted at once while their refund participant
refuses connections (nothing listens on its port) for D seconds; then it returns with a limit
of L calls in any second (it answers 429 beyond that), and its Webhook declares
`spec.limits.callsPerSecond: L - 1` (burst 1: at most L in any second). Measured: sagas halted,
calls the participant saw in its busiest second, calls it refused as over its limit, calls the
operator attempted while it was down (its attempts counter), and the time from its return to the
last compensation.

    python -m bench.wave --sagas 500 --down 60 --limit 50
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families
from tests.support.manifests import webhook
from tests.support.participants import AtMost, Participant, most_in_one_second

from bench.compensation import bounded, make_saga, phases, until
from bench.harness import Bench, bench_cluster, print_table, save
from undolog.kube import Kube


def attempts_made(metrics_url: str) -> float:
    """The operator's compensation attempts so far (every outcome)."""
    text = httpx.get(metrics_url, timeout=10).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "undolog_compensation_attempts"
        for sample in family.samples
        if sample.name.endswith("_total")
    )


async def all_active(kube: Kube, namespace: str, sagas: int) -> bool:
    return (await phases(kube, namespace)).get("Active", 0) >= sagas


async def measure(bench: Bench, sagas: int, down: float, limit: int) -> dict[str, Any]:
    kube = bench.kube
    namespace = await bench.namespace(f"wave{sagas}")
    participant = Participant()
    hook = webhook("undo", url=participant.url("/undo"))
    hook["spec"]["limits"] = {"callsPerSecond": limit - 1, "burst": 1}
    await kube.create("webhooks", namespace, hook)
    names = [f"w{i:04d}" for i in range(sagas)]
    await bounded((lambda name=name: make_saga(kube, namespace, name) for name in names), limit=50)  # type: ignore[misc]
    operator = bench.operator(namespace)
    try:
        await until(lambda: all_active(kube, namespace, sagas), 300, f"{sagas} sagas Active")
        participant.down()
        went_down = time.monotonic()
        before = await asyncio.to_thread(attempts_made, f"http://127.0.0.1:{operator.metrics_port}/metrics")
        await bounded(
            (lambda name=name: kube.patch("sagas", namespace, name, {"spec": {"outcome": "Abort"}}) for name in names),  # type: ignore[misc]
            limit=100,
        )
        await asyncio.sleep(max(down - (time.monotonic() - went_down), 0.0))
        while_down = (
            await asyncio.to_thread(attempts_made, f"http://127.0.0.1:{operator.metrics_port}/metrics") - before
        )
        at_most = AtMost(limit)
        participant.handle("/undo", at_most)
        participant.up()
        back = time.monotonic()
        # Ten times the calls at the participant's limit: an operator that stops ends the run.
        deadline = back + 10 * 3 * sagas / limit + 60
        while (counted := await phases(kube, namespace)).get("Compensated", 0) + counted.get("Halted", 0) < sagas:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{deadline - back:.0f} s after the participant's return: {counted} of {sagas}")
            await asyncio.sleep(1.0)  # a LIST of every saga: seldom, not to load the apiserver measured
        arrivals = [r.at for r in participant.received("/undo")]
        return {
            "sagas": sagas,
            "down_seconds": down,
            "limit_per_second": limit,
            "halted_sagas": counted.get("Halted", 0),
            "compensated_sagas": counted.get("Compensated", 0),
            "calls_received": len(arrivals),
            "max_calls_in_1s": most_in_one_second(arrivals),
            "refused_over_limit": at_most.refused,
            "attempts_while_down": int(while_down),
            "seconds_after_return": round(max(arrivals, default=back) - back, 1),
        }
    finally:
        operator.stop()
        participant.close()


async def main(sagas: int, down: float, limit: int) -> None:
    async with bench_cluster() as bench:
        result = await measure(bench, sagas, down, limit)
    print_table(
        ["sagas", "down", "limit", "halted", "busiest second", "429s", "attempts while down", "return to last call"],
        [
            [
                result["sagas"],
                f"{down:g} s",
                f"{limit}/s",
                result["halted_sagas"],
                result["max_calls_in_1s"],
                result["refused_over_limit"],
                result["attempts_while_down"],
                f"{result['seconds_after_return']} s",
            ]
        ],
    )
    print(result)
    save("wave", result)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sagas", type=int, default=500)
    parser.add_argument("--down", type=float, default=60.0)
    parser.add_argument("--limit", type=int, default=50)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.sagas, arguments.down, arguments.limit))
