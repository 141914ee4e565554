"""Comparison benchmark: 500 jobs in the database, the compare API and the compare page, p50 and p95.

500 jobs are written straight into the database (names and learning rates differ; 20 telemetry lines of
2 blocks each; every other job has a summary.json with its final losses and a top-1), on SQLite and,
where Debian's PostgreSQL is installed, on a throw-away PostgreSQL (tests/service/services.py). The real
app serves it over HTTP (uvicorn), and each request below is sent `--requests` times after 3 warm-ups:

  api         GET /api/v1/compare?limit=50&sort=-samples_per_s   (all 500 selected: the diff reads 500 specs)
  page        GET /compare?name=cmp&sort=-samples_per_s          (the same selection, the dashboard's paged table)
  spec_sort   GET /api/v1/compare?limit=50&sort=spec.train.lr    (sorted in Python over the 500 specs)
  loss_sort   GET /api/v1/compare?limit=50&sort=final_loss       (reads all 500 jobs' summary.json files)

Printed, and written to benchmarks/records/compare-500.json (`--out`) with the machine and, per database, the
load other processes put on it while its requests were timed (`quiet` or `shared`, as `pipebd bench` records
say; a throw-away PostgreSQL's backends serving the bench's database are the bench's own); never asserted.

.venv/bin/python benchmarks/compare_500.py [--jobs 500] [--requests 50] [--only sqlite|postgresql]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from sqlmodel import Session

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from app.core.database import get_engine, migrate  # noqa: E402
from app.core.queue import queue_name  # noqa: E402
from app.core.settings import Settings  # noqa: E402
from app.core.tables import Job, JobMetric  # noqa: E402
from app.main import create_app  # noqa: E402
from pipebd_core.bench.conditions import LoadMeter, OutsideTree, commit, load_without, machine  # noqa: E402
from pipebd_core.documents.summary import Summary  # noqa: E402
from pipebd_core.rundir import RunDir  # noqa: E402
from tests.service.factories import tiny_job  # noqa: E402
from tests.service.live import serve  # noqa: E402
from tests.service.services import create_database, drop_database, start_postgres  # noqa: E402
from tests.telemetry_lines import distill_line  # noqa: E402

LINES = 20  # telemetry lines per job
LRS = (0.01, 0.02, 0.05, 0.1)
REQUESTS = {
    "api": "/api/v1/compare?limit=50&sort=-samples_per_s",
    "page": "/compare?name=cmp&sort=-samples_per_s",
    "spec_sort": "/api/v1/compare?limit=50&sort=spec.train.lr",
    "loss_sort": "/api/v1/compare?limit=50&sort=final_loss",
}
OUT = REPO / "benchmarks" / "records" / "compare-500.json"


def fill(settings: Settings, jobs: int) -> None:
    migrate(settings.database)
    with Session(get_engine(settings.database), expire_on_commit=False) as session:
        rows = [
            Job(
                name=f"cmp-{index:04d}",
                state=("succeeded", "failed", "running", "queued")[index % 4],
                nproc=2,
                queue=queue_name(2),
                spec=tiny_job(f"cmp-{index:04d}", train={"epochs": 1, "lr": LRS[index % len(LRS)]}),
                samples_per_s=float(1000 + (index * 7919) % 5000),
                plan_summary={"num_blocks": 2},
            )
            for index in range(jobs)
        ]
        session.add_all(rows)
        session.flush()
        for job in rows:
            assert job.id is not None
            lines = [distill_line(0, step, loss={0: 2.0 / (step + 1), 1: 3.0 / (step + 1)}) for step in range(LINES)]
            session.add_all(
                JobMetric(job_id=job.id, rank=0, seq=n + 1, epoch=0, step=n, time=line.time, record=line.to_json())
                for n, line in enumerate(lines)
            )
            if job.id % 2 == 0:
                folder = settings.runs / f"job-{job.id}"
                folder.mkdir(parents=True)
                RunDir(folder).save_summary(Summary(name=job.name, final_loss={0: 0.1, 1: 0.15}, student_top1=0.7))
                job.run_dir = str(folder)
        session.commit()


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def measure(database_url: str, label: str, jobs: int, requests: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="pipebd-bench-compare-") as folder:
        settings = Settings(
            data_dir=Path(folder) / "data",  # type: ignore[call-arg]
            database_url=database_url,
            broker_url=f"sqla+sqlite:///{folder}/broker.db",
        )
        settings.prepare_folders()
        started = time.perf_counter()
        fill(settings, jobs)
        filled_s = time.perf_counter() - started
        result: dict[str, Any] = {"database": label, "jobs": jobs, "fill_s": round(filled_s, 2)}
        meter, outside = LoadMeter.open(), OutsideTree(database_url if database_url.startswith("postgresql") else None)
        with serve(create_app(settings)) as base, httpx.Client(base_url=base, timeout=60) as client:
            for name, path in REQUESTS.items():
                for _ in range(3):
                    client.get(path).raise_for_status()
                times = []
                for _ in range(requests):
                    begun = time.perf_counter()
                    answer = client.get(path)
                    times.append(time.perf_counter() - begun)
                    answer.raise_for_status()
                result[name] = {
                    "path": path,
                    "requests": requests,
                    "p50_ms": round(1000 * statistics.median(times), 1),
                    "p95_ms": round(1000 * percentile(times, 0.95), 1),
                    "max_ms": round(1000 * max(times), 1),
                    "bytes": len(answer.content),
                }
                print(f"{label:10} {name:9} p50 {result[name]['p50_ms']:7.1f} ms  p95 {result[name]['p95_ms']:7.1f} ms")
        load = load_without(meter.load(), outside.seconds())  # the timed requests' window, warm-ups included
        result["load"] = load.model_dump()
        print(f"{label:10} other processes {load.other_cores:.3f} cores: {'shared' if load.shared else 'quiet'}")
        get_engine(database_url).dispose()
        return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--only", choices=["sqlite", "postgresql"])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    results = []
    if args.only in (None, "sqlite"):
        with tempfile.TemporaryDirectory(prefix="pipebd-bench-db-") as folder:
            results.append(measure(f"sqlite:///{folder}/pipebd.db", "SQLite", args.jobs, args.requests))
    if args.only in (None, "postgresql"):
        service = start_postgres()
        try:
            if service.url is None:
                print(f"PostgreSQL skipped: {service.reason}")
            else:
                url = create_database(service.url)
                try:
                    results.append(measure(url, "PostgreSQL", args.jobs, args.requests))
                finally:
                    drop_database(service.url, url)
        finally:
            service.stop()
    record = {
        "benchmark": "compare",
        "commit": commit(),
        "machine": machine().model_dump(),
        "results": results,
    }
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"written: {args.out.relative_to(REPO) if args.out.is_relative_to(REPO) else args.out}")


if __name__ == "__main__":
    main()
