"""The idle resident memory of `pipebd api`: after start-up, and idle again after one job was submitted.

Starts `pipebd api` on a free loopback port with its own data folder, waits for /healthz, sleeps, and
reads the resident set size (RSS) of the API process and of every process it started (the spec
checker), then submits a bundled example once (VGG-16 by default), waits, and reads them again.

.venv/bin/python benchmarks/api_memory.py [--idle-s 5]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.service.services import free_port  # noqa: E402

EXAMPLES = REPO / "examples"
START_TIMEOUT_S = 120


def resident_mib(pid: int) -> tuple[float, float]:
    """(RSS of the process, RSS of its descendants), in MiB."""
    process = psutil.Process(pid)
    children = sum(child.memory_info().rss for child in process.children(recursive=True))
    return process.memory_info().rss / 2**20, children / 2**20


def wait_healthy(url: str, process: subprocess.Popen[bytes]) -> float:
    started = time.monotonic()
    while time.monotonic() - started < START_TIMEOUT_S:
        if process.poll() is not None:
            raise RuntimeError(f"pipebd api exited with {process.returncode}")
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return time.monotonic() - started
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"pipebd api did not answer within {START_TIMEOUT_S} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--idle-s", type=float, default=5.0, help="seconds to stay idle before each reading")
    parser.add_argument("--example", default="vgg16-dsconv.yaml", help="the bundled example to submit")
    args = parser.parse_args()
    idle_s, example = args.idle_s, EXAMPLES / args.example
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {key: value for key, value in os.environ.items() if not key.startswith("PIPEBD_")}
    with tempfile.TemporaryDirectory() as folder:
        command = [sys.executable, "-m", "app.cli", "api", "--port", str(port), "--data-dir", folder]
        api = subprocess.Popen(command, cwd=REPO, env=env)
        try:
            print(f"pipebd api answered after {wait_healthy(url, api):.1f} s")
            time.sleep(idle_s)
            own, helpers = resident_mib(api.pid)
            print(f"idle after start-up: API {own:.0f} MiB, its helper processes {helpers:.0f} MiB")
            response = httpx.post(f"{url}/api/v1/jobs", json=yaml.safe_load(example.read_text()), timeout=120)
            print(f"submitted {example.name}: HTTP {response.status_code}")
            time.sleep(idle_s)
            own, helpers = resident_mib(api.pid)
            print(f"idle {idle_s:.0f} s after a submission: API {own:.0f} MiB, its helper processes {helpers:.0f} MiB")
        finally:
            api.terminate()
            api.wait(timeout=60)


if __name__ == "__main__":
    main()
