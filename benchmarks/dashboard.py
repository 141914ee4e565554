"""Dashboard benchmark: how fast the page of a job with 100,000 metric points loads. Target: < 1 s.

A finished 4-rank hybrid job with 100,000 telemetry lines (25,000 per rank, 4 blocks), the chart
rollups the worker writes with them, and a profiled plan (ranked alternatives, simulated timelines)
is written straight into the database: SQLite, and PostgreSQL when 127.0.0.1:5432 answers. The real
app serves it over HTTP (uvicorn) and Debian's Chromium (Playwright) opens `/jobs/{id}` several
times. Printed, never asserted:

  metrics   GET /api/v1/jobs/{id}/metrics?max_points=500, the downsampled history the page draws
  page      navigation start -> charts and schedules drawn (`performance.now()` when the page's
            script marks itself ready), and the same seen from outside (goto .. ready)

.venv/bin/python benchmarks/dashboard.py [--points 100000] [--loads 5] [--only sqlite|postgresql]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
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
from app.core.downsample import to_point  # noqa: E402
from app.core.queue import queue_name  # noqa: E402
from app.core.rollups import RollupBuilder  # noqa: E402
from app.core.settings import Settings  # noqa: E402
from app.core.tables import Job, JobEvent, JobMetric, JobMetricRollup  # noqa: E402
from app.main import create_app  # noqa: E402
from pipebd_core.planning.distill_costmodel import CostModel  # noqa: E402
from pipebd_core.planning.distill_planner import mode_plans, predictions  # noqa: E402
from tests.fake_profiles import fake_profile  # noqa: E402
from tests.service.factories import tiny_job  # noqa: E402
from tests.service.live import serve  # noqa: E402
from tests.service.services import POSTGRES_DEFAULT, create_database, drop_database, postgres_answers  # noqa: E402
from tests.web.browser import CHROMIUM, CHROMIUM_ARGS  # noqa: E402

NPROC, BLOCKS, BATCH = 4, 4, 64
INSERT_BATCH = 5000


def plan_document() -> dict[str, Any]:
    """A profiled hybrid plan of 4 blocks on 4 ranks, as the planner writes it."""
    model = CostModel(fake_profile([4.0, 2.0, 1.0, 1.0], [1.0, 1.0, 0.5, 0.5], NPROC, batch_size=BATCH, p2p=0.05))
    plan = mode_plans(model)["hybrid"]
    plan.details.predictions = predictions(plan, model)
    plan.block_names = [f"block{i}" for i in range(BLOCKS)]
    return plan.to_json()


def telemetry(plan: dict[str, Any], points: int) -> list[dict[str, Any]]:
    """`points` lines spread over the ranks: losses decaying with noise, phases, memory."""
    per_rank, rows, start = points // NPROC, [], time.time() - points
    for info in plan["ranks"]:
        rank, blocks = info["rank"], info["blocks"]
        for seq in range(1, per_rank + 1):
            step = seq - 1
            loss = {str(b): (1.0 + b) / (1 + step / 500) * (1 + 0.1 * random.random()) for b in blocks}
            record = {
                "time": start + step * 0.04 + rank * 0.001,
                "rank": rank,
                "epoch": step // 1000,
                "step": step,
                "round": "weights",
                "blocks": blocks,
                "loss": loss,
                "phases": {
                    "data": 0.002,
                    "recv_wait": 0.004 * rank,
                    "teacher": 0.01,
                    "send": 0.001,
                    "student": 0.015,
                    "allreduce": 0.002,
                    "barrier": 0.0,
                    "optim": 0.002,
                },
                "samples": info["rows"][1] - info["rows"][0],
                "peak_mem": 2**30 + step,
                "done": seq,
                "total": per_rank,
            }
            rows.append(
                {
                    "rank": rank,
                    "seq": seq,
                    "epoch": record["epoch"],
                    "step": step,
                    "time": record["time"],
                    "record": record,
                }
            )
    return rows


def fill(database: str, runs: Path, points: int) -> int:
    """A finished job with `points` telemetry lines; returns its id."""
    migrate(database)
    plan = plan_document()
    run_dir = runs / "bench-job"
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "plan.json").write_text(json.dumps(plan))
    (run_dir / "events.jsonl").write_text(json.dumps({"time": time.time(), "event": "finished"}) + "\n")
    spec = tiny_job("bench-100k", schedule={"mode": "hybrid", "nproc": NPROC})
    summary = {key: plan[key] for key in ("mode", "nproc", "num_blocks", "batch_size", "stages")}
    now = time.time()
    job = {
        "name": "bench-100k",
        "state": "succeeded",
        "nproc": NPROC,
        "queue": queue_name(NPROC),
        "spec": spec,
        "created_at": now - points,
        "updated_at": now,
        "started_at": now - points * 0.04,
        "finished_at": now,
        "progress": 1.0,
        "samples_per_s": 1600.0,
        "plan_summary": summary,
        "run_dir": str(run_dir),
    }
    engine = get_engine(database)
    with engine.begin() as connection:
        job_id = int(connection.execute(insert(Job).returning(Job.id), [job]).scalar_one())  # type: ignore[arg-type]
        rows = [{**row, "job_id": job_id} for row in telemetry(plan, points)]
        for first in range(0, len(rows), INSERT_BATCH):
            connection.execute(insert(JobMetric), rows[first : first + INSERT_BATCH])
        # the chart rollups the worker's streamer writes with the lines (app/core/rollups.py)
        rollups = RollupBuilder(job_id).add([to_point(row["record"], row["seq"]) for row in rows])
        connection.execute(insert(JobMetricRollup), [rollup.model_dump(exclude={"id"}) for rollup in rollups])
        connection.execute(
            insert(JobEvent),
            [
                {
                    "job_id": job_id,
                    "kind": "state",
                    "time": now,
                    "data": {"state": "succeeded", "termination_reason": None},
                }
            ],
        )
    return job_id


def describe(values: list[float]) -> str:
    scaled = [value * 1000 for value in values]
    return f"n={len(values)} p50={statistics.median(scaled):.0f}ms max={max(scaled):.0f}ms"


def measure(database: str, label: str, points: int, loads: int) -> None:
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="pipebd-bench-dashboard-") as folder:
        settings = Settings(
            data_dir=Path(folder), database_url=database, broker_url=f"sqla+sqlite:///{folder}/broker.db"
        )
        job_id = fill(database, settings.runs, points)
        with serve(create_app(settings)) as url:
            api = []
            for _ in range(loads):
                began = time.perf_counter()
                answer = httpx.get(f"{url}/api/v1/jobs/{job_id}/metrics?max_points=500", timeout=60)
                api.append(time.perf_counter() - began)
            assert answer.json()["total"] == points // NPROC * NPROC, answer.text[:200]
            in_page, outside = [], []
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
                for _ in range(loads):
                    page = browser.new_page(viewport={"width": 1280, "height": 900})
                    began = time.perf_counter()
                    page.goto(f"{url}/jobs/{job_id}")
                    page.wait_for_selector("body[data-ready='1']", timeout=60_000)
                    outside.append(time.perf_counter() - began)
                    in_page.append(float(page.evaluate("document.body.dataset.readyMs")) / 1000)
                    drawn = int(page.locator("#chart-loss").get_attribute("data-points") or 0)
                    page.close()
                browser.close()
    print(f"{label:<11} {points:,} points ({NPROC} ranks); the loss chart draws {drawn:,} values")
    print(f"  metrics  GET ?max_points=500   {describe(api)}")
    print(f"  page     ready (in the page)   {describe(in_page)}   target < 1000 ms")
    print(f"  page     goto .. ready         {describe(outside)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--points", type=int, default=100_000)
    parser.add_argument("--loads", type=int, default=5)
    parser.add_argument("--only", choices=["sqlite", "postgresql"])
    args = parser.parse_args()
    if not CHROMIUM.exists():
        sys.exit(f"{CHROMIUM} is missing: apt-get install chromium")
    if args.only in (None, "sqlite"):
        with tempfile.TemporaryDirectory(prefix="pipebd-bench-db-") as folder:
            measure(f"sqlite:///{folder}/pipebd.db", "SQLite", args.points, args.loads)
    if args.only in (None, "postgresql"):
        if not postgres_answers(POSTGRES_DEFAULT):
            print("PostgreSQL  skipped: nothing answers on 127.0.0.1:5432")
            return
        url = create_database(POSTGRES_DEFAULT)
        try:
            measure(url, "PostgreSQL", args.points, args.loads)
        finally:
            get_engine(url).dispose()
            drop_database(POSTGRES_DEFAULT, url)


if __name__ == "__main__":
    main()
