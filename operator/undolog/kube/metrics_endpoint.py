"""/metrics, served on the operator's event loop beside kopf's liveness endpoint (kopf_runtime).
prometheus_client's own server is a thread that wakes twice a second to poll its socket: an
idle operator paid for each wake-up."""

from __future__ import annotations

from aiohttp import web
from prometheus_client.aiohttp import make_aiohttp_handler


async def serve_metrics(port: int) -> web.AppRunner:
    """Serve the process's metrics on `port` (every address) until the runner is cleaned up."""
    app = web.Application()
    app.router.add_get("/metrics", make_aiohttp_handler())
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, host="0.0.0.0", port=port).start()  # scraped at the pod's address
    return runner
