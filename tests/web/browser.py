"""Browser tier helpers: the real service (`pipebd up`) on a free port, and Debian's Chromium driven
by Playwright with every console error and uncaught exception of a page recorded.

Chromium is `/usr/bin/chromium` (`make test` installs Debian's package where it is missing;
`playwright install` cannot download here); without it the browser tests skip, saying so.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pipebd_core.job.agent_server import SHARED_AGENTS
from pipebd_core.planning.profiles import CACHE_ENV
from tests.service.services import free_port
from tests.service.workers import REPO, wait_for

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = REPO / "test-output"
# what Chromium writes to the console when a request is answered with an error status
NETWORK_ERROR = "Failed to load resource: the server responded with a status of {status}"
DESKTOP = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}


def pipebd_command() -> list[str]:
    script = Path(sys.executable).parent / "pipebd"
    return [str(script)] if script.exists() else [sys.executable, "-m", "app.cli"]


@contextmanager
def pipebd_up(folder: Path, **settings: str) -> Iterator[str]:
    """`pipebd up` with its data under `folder`; yields the base URL; Ctrl-C (SIGINT) stops it."""
    port, output = free_port(), folder / "up.log"
    kept = (CACHE_ENV, SHARED_AGENTS)  # the session's profile cache and agent server (tests/conftest.py)
    env = {key: value for key, value in os.environ.items() if not key.startswith("PIPEBD_") or key in kept}
    env.update({"PIPEBD_POLL_S": "0.1", "PIPEBD_SSE_POLL_S": "0.1", "PIPEBD_KILL_GRACE_S": "3", **settings})
    command = [*pipebd_command(), "up", "--port", str(port), "--data-dir", str(folder / "data")]
    with output.open("wb") as handle:
        up = subprocess.Popen(command, cwd=REPO, env=env, stdout=handle, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: "dashboard and API at" in output.read_text(), 120, "pipebd up", output.read_text)
        yield f"http://127.0.0.1:{port}"
    finally:
        up.send_signal(signal.SIGINT)
        try:
            up.wait(timeout=60)
        except subprocess.TimeoutExpired:
            up.kill()
            up.wait()


@dataclass
class Watched:
    """A page and what went wrong in it: console errors and uncaught exceptions."""

    page: Any
    errors: list[str] = field(default_factory=list)

    def screenshot(self, name: str) -> Path:
        SCREENSHOTS.mkdir(exist_ok=True)
        path = SCREENSHOTS / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path

    def overflow(self) -> int:
        """Pixels the page is wider than the window (0: nothing to scroll sideways)."""
        return int(self.page.evaluate("document.documentElement.scrollWidth - window.innerWidth"))


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing: `apt-get install chromium` (make test does it as root)")
    playwright_api = pytest.importorskip("playwright.sync_api", reason="Playwright for Python is not installed")
    with playwright_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        yield launched
        launched.close()


@contextmanager
def watched_page(browser: Any, base_url: str, viewport: dict[str, int] = DESKTOP) -> Iterator[Watched]:
    context = browser.new_context(base_url=base_url, viewport=viewport)
    page = context.new_page()
    page.set_default_timeout(30_000)
    watched = Watched(page)
    page.on("console", lambda message: message.type == "error" and watched.errors.append(message.text))
    page.on("pageerror", lambda error: watched.errors.append(f"uncaught: {error}"))
    try:
        yield watched
    finally:
        context.close()
