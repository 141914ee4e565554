"""Real HTTP servers for the tests: the app under uvicorn in a background thread (for streams a test
reads live), or a `pipebd api` process (where the process itself matters: its memory, its helpers)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import httpx
import uvicorn
from fastapi import FastAPI

from app.core.settings import Settings
from tests.service.services import free_port
from tests.service.workers import REPO, service_env, wait_for


@contextmanager
def serve(app: FastAPI) -> Iterator[str]:
    """Serve `app` on a free loopback port; yields its base URL, stops it on exit."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not server.started:
        if time.time() > deadline:
            raise RuntimeError("uvicorn did not start within 30 s")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@dataclass
class ApiProcess:
    process: subprocess.Popen[bytes]
    url: str


@contextmanager
def pipebd_api(settings: Settings, **environment: str) -> Iterator[ApiProcess]:
    """`pipebd api` on a free loopback port with `settings` (and extra PIPEBD_* `environment`); stopped on exit."""
    port = free_port()
    env = {**os.environ, **service_env(settings), **environment}
    command = [sys.executable, "-m", "app.cli", "api", "--port", str(port), "--data-dir", str(settings.data_dir)]
    process = subprocess.Popen(command, cwd=REPO, env=env)
    url = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        assert process.poll() is None, f"pipebd api exited with {process.returncode}"
        try:
            return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_for(answers, 120, "pipebd api to answer")
        yield ApiProcess(process, url)
    finally:
        process.terminate()
        process.wait(timeout=60)
