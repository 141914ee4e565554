"""Bringing a running job's files into the database: telemetry lines in batches, log lines, progress.

Each poll reads the complete lines the ranks appended since the last poll and writes, in one
transaction, the `job_metric` rows (and the chart rollups they complete, app/core/rollups.py), one
`metrics` event naming their id range, `log` events, and the job's progress and samples/s. The event
stream of the API replays exactly these events.
"""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import update
from sqlmodel import Session, col

from app.core.database import session_scope
from app.core.downsample import to_point
from app.core.rollups import RollupBuilder
from app.core.tables import Job, JobEvent, JobMetric, now
from pipebd_core.plan import Plan
from pipebd_core.progress import FileTail, MetricsFollower
from pipebd_core.rundir import RunDir

LOG_LINES_PER_EVENT = 200  # longer bursts are split over several events
LAUNCHER = "launcher"


class TelemetryStreamer:
    def __init__(self, database: str, job_id: int, run_dir: RunDir, plan: Plan) -> None:
        self.database = database
        self.job_id = job_id
        self.follower = MetricsFollower(run_dir, plan)
        self.rollups = RollupBuilder(job_id)
        self.logs: dict[str, FileTail] = {str(rank): FileTail(run_dir.log(rank)) for rank in range(plan.nproc)}
        self.logs[LAUNCHER] = FileTail(run_dir.root / "logs" / "launcher.log")
        self.lines_stored = 0
        self.nproc, self.batch_size = plan.nproc, plan.batch_size
        self.total_steps = int(plan.details.get("total_steps", 0))
        self.started = time.time()

    def progress(self) -> tuple[float, float]:
        """(fraction done, samples/s) from each rank's latest `done`/`total`.

        Cheap on purpose: the engine's Progress.fraction enumerates every task of every rank on each
        call (about a second for a 40,000-step job), which would stall heartbeats. A rank that has not
        reported yet counts as nothing done of the largest total reported.
        """
        latest = self.follower.progress.latest
        if not latest:
            return 0.0, 0.0
        largest = max(record["total"] for record in latest.values())
        done = sum(record["done"] for record in latest.values())
        total = sum(record["total"] for record in latest.values()) + largest * (self.nproc - len(latest))
        fraction = min(1.0, done / max(1, total))
        elapsed = max(1e-9, time.time() - self.started)
        return fraction, fraction * self.total_steps * self.batch_size / elapsed

    def poll(self) -> int:
        """Store what is new; returns the number of telemetry lines stored."""
        records = self.follower.poll()
        logs = {source: tail.read_new() for source, tail in self.logs.items()}
        logs = {source: lines for source, lines in logs.items() if lines}
        if not records and not logs:
            return 0
        with session_scope(self.database) as session:
            if records:
                self._store_metrics(session, records)
            for source, lines in logs.items():
                for start in range(0, len(lines), LOG_LINES_PER_EVENT):
                    chunk = lines[start : start + LOG_LINES_PER_EVENT]
                    rank = None if source == LAUNCHER else int(source)
                    session.add(JobEvent(job_id=self.job_id, kind="log", data={"rank": rank, "lines": chunk}))
        self.lines_stored += len(records)
        return len(records)

    def _store_metrics(self, session: Session, records: list[dict[str, Any]]) -> None:
        rows = [
            JobMetric(
                job_id=self.job_id,
                rank=int(record["rank"]),
                seq=int(record.get("done", 0)),
                epoch=int(record.get("epoch", 0)),
                step=int(record.get("step", 0)),
                time=float(record.get("time", now())),
                record=record,
            )
            for record in records
        ]
        session.add_all(rows)
        session.add_all(self.rollups.add([to_point(row.record, row.seq) for row in rows]))
        session.flush()
        fraction, speed = self.progress()
        ids = [row.id for row in rows if row.id is not None]
        data = {"first_id": min(ids), "last_id": max(ids), "progress": fraction, "samples_per_s": speed}
        session.add(JobEvent(job_id=self.job_id, kind="metrics", data=data))
        statement = update(Job).where(col(Job.id) == self.job_id).values(progress=fraction, samples_per_s=speed)
        session.execute(statement)
