"""The browser suite's parts: Debian's chromium driven by Playwright, one browser for the
session and a fresh page (its own cookies) per test, and the dashboard as a process."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from devtools.control_plane.local import free_port
from playwright.async_api import Browser, Page, async_playwright

from tests.conftest import Cluster
from tests.support.waiting import until_healthy

CHROMIUM = os.environ.get("UNDOLOG_CHROMIUM", "/usr/bin/chromium")
# No background traffic: this machine's network is closed, and tests stay on loopback.
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


class Dashboard:
    """`undolog dashboard` as a process, as a person would start it."""

    def __init__(self, cluster: Cluster, log: Path, *args: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "undolog.cli", "dashboard", f"--port={self.port}", *args],
                env=cluster.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        until_healthy(f"{self.url}/healthz", self.process, log.read_text, 30, "the dashboard")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=15)


@pytest.fixture
def dashboard(cluster: Cluster, tmp_path: Path) -> Iterator[Dashboard]:
    served = Dashboard(cluster, tmp_path / "dashboard.log", f"--kubeconfig={cluster.kubeconfig}")
    yield served
    served.stop()


@pytest.fixture(scope="session")
def chromium() -> str:
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: `make test` installs Debian's chromium"
    return CHROMIUM


@pytest_asyncio.fixture(scope="session")
async def browser(chromium: str) -> AsyncIterator[Browser]:
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=chromium, args=FLAGS)
        yield launched
        await launched.close()


@pytest_asyncio.fixture
async def page(browser: Browser) -> AsyncIterator[Page]:
    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    opened = await context.new_page()
    yield opened
    await context.close()
