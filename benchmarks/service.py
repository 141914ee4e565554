"""Service benchmarks: print measured numbers for the job service's targets (never asserted in tests).

list      GET /api/v1/jobs?limit=50 with 10,000 jobs stored, over real HTTP (uvicorn), on SQLite and,
          when it answers, PostgreSQL (127.0.0.1:5432, database `test`): p50/p95 of 300 requests.
          Target: p95 < 50 ms.
stream    metric -> SSE latency in a real `pipebd up` (embedded SQLite database and broker): a 2-rank
          job runs, and each telemetry line's own timestamp (written by the rank) is compared with
          the moment the SSE client receives it. Target: < 2 s.
launch    submission -> torchrun start with the embedded broker: from sending POST /jobs to the
          engine's `launched` event (written as torchrun's process starts), over 5 jobs run one
          at a time (1 rank, cancelled once launched). Target: < 3 s.

.venv/bin/python benchmarks/service.py [--only list,stream,launch]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import insert

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from app.core.database import get_engine, migrate  # noqa: E402
from app.core.queue import queue_name  # noqa: E402
from app.core.settings import Settings  # noqa: E402
from app.core.tables import Job  # noqa: E402
from app.main import create_app  # noqa: E402
from tests.service.factories import tiny_job  # noqa: E402
from tests.service.live import serve  # noqa: E402
from tests.service.services import POSTGRES_DEFAULT, create_database, drop_database, free_port, postgres_answers  # noqa: E402

JOBS = 10_000
REQUESTS = 300


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def describe(values: list[float], unit: str = "ms", scale: float = 1000.0) -> str:
    scaled = [value * scale for value in values]
    return (
        f"n={len(values)} p50={statistics.median(scaled):.1f}{unit} p95={percentile(scaled, 0.95):.1f}{unit}"
        f" max={max(scaled):.1f}{unit}"
    )


def fill_jobs(database: str) -> None:
    migrate(database)
    document = tiny_job()
    states = ["succeeded"] * 8 + ["failed", "cancelled"]
    rows = [
        {
            "name": f"bench-{i}",
            "state": states[i % len(states)],
            "nproc": 2,
            "queue": queue_name(2),
            "spec": document,
            "created_at": time.time(),
            "updated_at": time.time(),
            "progress": 1.0,
        }
        for i in range(JOBS)
    ]
    with get_engine(database).begin() as connection:
        connection.execute(insert(Job), rows)


def time_list(database: str, folder: Path) -> dict[str, str]:
    fill_jobs(database)
    settings = Settings(
        data_dir=folder / "data", database_url=database, broker_url=f"sqla+sqlite:///{folder}/broker.db"
    )
    results = {}
    with serve(create_app(settings)) as url, httpx.Client(base_url=url) as client:
        for label, params in (("first page", {"limit": 50}), ("state filter", {"limit": 50, "state": "failed"})):
            client.get("/api/v1/jobs", params=params)  # warm-up
            durations = []
            for _ in range(REQUESTS):
                started = time.perf_counter()
                response = client.get("/api/v1/jobs", params=params)
                durations.append(time.perf_counter() - started)
                assert response.status_code == 200 and len(response.json()["data"]) == 50
            results[label] = describe(durations)
        cursor, durations = None, []
        for _ in range(REQUESTS):  # walking deep pages
            started = time.perf_counter()
            page = client.get("/api/v1/jobs", params={"limit": 50, **({"cursor": cursor} if cursor else {})}).json()
            durations.append(time.perf_counter() - started)
            cursor = page["next_cursor"]
        results["cursor pages"] = describe(durations)
    return results


def bench_list() -> None:
    with tempfile.TemporaryDirectory() as folder:
        for label, value in time_list(f"sqlite:///{folder}/pipebd.db", Path(folder)).items():
            print(f"list  sqlite      {label:<13} {value}")
    if not postgres_answers(POSTGRES_DEFAULT):
        print("list  postgresql  skipped: nothing answers on 127.0.0.1:5432")
        return
    url = create_database(POSTGRES_DEFAULT)
    try:
        with tempfile.TemporaryDirectory() as folder:
            for label, value in time_list(url, Path(folder)).items():
                print(f"list  postgresql  {label:<13} {value}")
    finally:
        get_engine(url).dispose()
        drop_database(POSTGRES_DEFAULT, url)


class Up:
    """`pipebd up` in a subprocess on a free port, with its own data folder."""

    def __init__(self, folder: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.data = folder / "data"
        self.log = folder / "up.log"
        env = {key: value for key, value in os.environ.items() if not key.startswith("PIPEBD_")}
        command = [sys.executable, "-m", "app.cli", "up", "--port", str(self.port), "--data-dir", str(self.data)]
        with self.log.open("wb") as handle:
            self.process = subprocess.Popen(command, cwd=REPO, env=env, stdout=handle, stderr=subprocess.STDOUT)
        deadline = time.time() + 120
        while "dashboard and API at" not in self.log.read_text():
            if time.time() > deadline or self.process.poll() is not None:
                raise RuntimeError(self.log.read_text())
            time.sleep(0.2)

    def wait_state(self, job_id: int, states: set[str], timeout: float = 180) -> dict[str, Any]:
        deadline = time.time() + timeout
        while time.time() < deadline:
            job: dict[str, Any] = httpx.get(f"{self.url}/api/v1/jobs/{job_id}").json()
            if job["state"] in states:
                return job
            time.sleep(0.05)
        raise RuntimeError(f"job {job_id} did not reach {states}")

    def stop(self) -> None:
        self.process.send_signal(signal.SIGINT)
        self.process.wait(timeout=60)


def bench_stream() -> None:
    from app.cli.client import events

    with tempfile.TemporaryDirectory() as folder:
        up = Up(Path(folder))
        try:
            job_id = httpx.post(f"{up.url}/api/v1/jobs", json=tiny_job(train={"epochs": 40})).json()["id"]
            latencies = []
            for event in events(up.url, None, job_id):
                if event.name == "metrics":
                    received = time.time()
                    latencies += [received - record["time"] for record in event.data["records"]]
            print(f"stream metric->SSE (2 ranks, {len(latencies)} lines)  {describe(latencies, 's', 1.0)}")
        finally:
            up.stop()


def launched_at(run_dir: Path) -> float | None:
    path = run_dir / "events.jsonl"
    if not path.exists():
        return None
    for line in path.read_text().splitlines():
        event = json.loads(line)
        if event["event"] == "launched":
            return float(event["time"])
    return None


def bench_launch(repeats: int = 5) -> None:
    with tempfile.TemporaryDirectory() as folder:
        up = Up(Path(folder))
        try:
            delays = []
            for _ in range(repeats):
                sent = time.time()
                job_id = httpx.post(f"{up.url}/api/v1/jobs", json=tiny_job(schedule={"nproc": 1})).json()["id"]
                up.wait_state(job_id, {"running"})
                run_dir = up.data / "runs" / f"job-{job_id}"
                deadline = time.time() + 30
                while (start := launched_at(run_dir)) is None and time.time() < deadline:
                    time.sleep(0.05)
                assert start is not None
                delays.append(start - sent)
                httpx.post(f"{up.url}/api/v1/jobs/{job_id}/cancel")  # one torchrun job at a time
                up.wait_state(job_id, {"cancelled", "succeeded", "failed"})
            print(f"launch submission->torchrun start (embedded broker)  {describe(delays, 's', 1.0)}")
        finally:
            up.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="list,stream,launch", help="comma-separated: list, stream, launch")
    chosen = parser.parse_args().only.split(",")
    for name, bench in (("list", bench_list), ("stream", bench_stream), ("launch", bench_launch)):
        if name in chosen:
            bench()


if __name__ == "__main__":
    main()
