"""The floor's requests made from Python: bench/goclients/floor, line for line, on aiohttp (the
operator's HTTP client) and asyncio. What a Python controller pays for the same watch, LIST,
calls and writes before it decides anything, so the operator's CPU per saga can be read as the
language's share and UndoLog's own. Prints "watching" once its watch is open.

    python -m bench.python_floor --server URL --ca F --cert F --key F --namespace NS --participant URL
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
from typing import Any
from urllib.parse import quote

import aiohttp

MERGE_PATCH = {"Content-Type": "application/merge-patch+json"}


class Floor:
    def __init__(self, options: argparse.Namespace, api: aiohttp.ClientSession, tls: ssl.SSLContext) -> None:
        self.api, self.tls = api, tls
        self.namespace, self.target = options.namespace, options.participant
        self.base = f"{options.server}/apis/undolog.io/v1beta1/namespaces/{options.namespace}"
        self.entries = f"{options.server}/apis/undolog.io/v1beta2/namespaces/{options.namespace}/undoentries/"
        self.participant = aiohttp.ClientSession()
        self.running: set[asyncio.Task[None]] = set()

    async def send(self, method: str, url: str, body: str | None = None) -> Any:
        headers = MERGE_PATCH if body is not None else None
        async with self.api.request(method, url, data=body, headers=headers, ssl=self.tls) as answer:
            if answer.status != 200:
                raise RuntimeError(f"{method} {url}: HTTP {answer.status}: {await answer.text()}")
            return json.loads(await answer.read())

    async def watch(self) -> None:
        listed = await self.send("GET", self.base + "/sagas?limit=1")
        url = f"{self.base}/sagas?watch=1&resourceVersion={listed['metadata']['resourceVersion']}"
        handled: set[str] = set()
        async with self.api.get(url, ssl=self.tls, timeout=aiohttp.ClientTimeout(total=None)) as stream:
            print("watching", flush=True)
            async for line in stream.content:
                saga = json.loads(line)["object"]
                name = saga["metadata"]["name"]
                if saga.get("spec", {}).get("outcome") == "Abort" and name not in handled:
                    handled.add(name)
                    task = asyncio.create_task(self.compensate(name))
                    self.running.add(task)
                    task.add_done_callback(self.running.discard)

    async def compensate(self, name: str) -> None:
        selector = quote(f"spec.saga={name}")
        listed = await self.send("GET", f"{self.base}/undoentries?fieldSelector={selector}")
        entries = sorted(listed["items"], key=lambda e: e["spec"]["stackPosition"], reverse=True)
        status = f"{self.base}/sagas/{name}/status"
        writing = asyncio.create_task(self.send("PATCH", status, '{"status":{"phase":"Compensating"}}'))
        for entry in entries:
            await self.call(name, entry)
            settled = '{"metadata":{"managedFields":[{}]},"status":{"state":"Compensated"}}'
            await self.send("PATCH", self.entries + entry["metadata"]["name"], settled)
        await writing
        await self.send("PATCH", status, '{"status":{"phase":"Compensated"}}')
        await self.send(
            "PATCH", f"{self.base}/sagas/{name}", '{"metadata":{"labels":{"undolog.io/phase":"Compensated"}}}'
        )

    async def call(self, saga: str, entry: dict[str, Any]) -> None:
        spec = entry["spec"]
        headers = {
            "Content-Type": "application/json",
            "Idempotency-Key": spec["undoId"],
            "Undolog-Saga": f"{self.namespace}/{saga}",
            "Undolog-Step": spec["step"],
            "Undolog-Attempt": "1",
        }
        body = json.dumps(spec["compensation"].get("args", {}))
        async with self.participant.post(self.target, data=body, headers=headers) as answer:
            await answer.read()


async def main(options: argparse.Namespace) -> None:
    tls = ssl.create_default_context(cafile=options.ca)
    tls.load_cert_chain(options.cert, options.key)
    async with aiohttp.ClientSession() as api:
        await Floor(options, api, tls).watch()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for flag in ("server", "ca", "cert", "key", "namespace", "participant"):
        parser.add_argument(f"--{flag}", required=True)
    asyncio.run(main(parser.parse_args()))
