"""Bringing a running job's files into the database: telemetry lines in batches, log growth, progress.

Each poll reads the complete telemetry lines the ranks appended since the last poll and writes, in
one transaction, the `job_metric` rows (and the chart rollups they complete, app/core/rollups.py),
one `metrics` event naming their id range, and the job's progress and samples/s (from
pipebd_core/figures.py over each rank's newest lines, a window the streamer keeps as they are stored:
app/core/figures.py). Logs are not copied: a `log` event says which log of which phase grew to what
size, and readers fetch the bytes from the run directory (`GET /api/v1/jobs/{id}/logs`). The event stream
of the API replays exactly these events.

A line's `seq` counts its rank's tasks over every launch of the phase (`seq_of`). A job that runs
again (resumed, restarted) re-reads its telemetry files from the start, and its ranks redo the steps
after their last checkpoint: a line is stored only when its rank's `seq` is past the highest one
already stored for that phase (an evaluation line, once per epoch), so every step is stored exactly
once, whatever attempt wrote it. Lines that could not be stored (the database did not answer) are kept
and stored by the next poll. Lines of another format version (a run directory an earlier PipeBD wrote
into, resumed) are passed over with one warning in the worker's log: the attempt that wrote them stored them.
A streamer stores only while its run still holds the job (worker/launcher.py `JobRunner.holds`, checked on the
job's row, locked, in the storing transaction): a worker whose heartbeats went stale (a database outage, a
stalled machine) may find its job reaped and claimed by another worker, and then stores nothing more
(`TakenOver`).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from typing import TypedDict

from sqlalchemy import update
from sqlmodel import Session, col, func, select

from app.core.database import DATABASE_DOWN, session_scope
from app.core.downsample import to_point
from app.core.figures import FigureWindow, store_figures
from app.core.rollups import RollupBuilder
from app.core.tables import EVAL_SEQ, Job, JobEvent, JobMetric
from pipebd_core.documents.phases import DISTILL, FINETUNE, PhaseRecord
from pipebd_core.documents.telemetry import EvalLine, TelemetryLine
from pipebd_core.job.phases import job_fraction
from pipebd_core.job.progress import MetricsFollower
from pipebd_core.rundir import RunDir

log = logging.getLogger("pipebd.worker")
LAUNCHER = "launcher"
PHASES_WITH_METRICS = (DISTILL, FINETUNE)


def seq_of(line: TelemetryLine) -> int:
    """A line's place among its rank's tasks of the phase, over every launch: the tasks this launch did
    (`done`) after those done before it (`skipped`: a resume, a re-plan); EVAL_SEQ for an evaluation."""
    return EVAL_SEQ if isinstance(line, EvalLine) else line.seq


class TakenOver(RuntimeError):
    """The job is no longer this worker's: reaped and claimed again elsewhere while this worker ran it."""


Holds = Callable[[Session], bool]  # whether the job's row, locked in this session, still names this run's claim


class Progress(TypedDict):
    """A job row's progress fields: the whole job's and the current phase's fraction done, and samples/s."""

    progress: float
    phase_progress: float
    samples_per_s: float | None


class TelemetryStreamer:
    def __init__(self, database: str, job_id: int, run_dir: RunDir, nproc: int, holds: Holds | None = None) -> None:
        self.database, self.job_id, self.run_dir, self.nproc = database, job_id, run_dir, nproc
        self.holds = holds  # None: store whoever holds the job (a test's streamer)
        self.followers: dict[str, MetricsFollower] = {}
        self.rollups = {phase: RollupBuilder(job_id, phase) for phase in PHASES_WITH_METRICS}
        self.log_sizes: dict[tuple[str, str], int] = {}
        self.samples_per_s: float | None = None  # the job's, as the last poll that stored lines computed it
        self.window = FigureWindow()  # each rank's newest stored lines: what the figures are computed over
        self.stored_seq, self.stored_evals = self._stored()
        self.unsent: dict[str, list[TelemetryLine]] = {}  # read, not yet stored (the database did not answer)
        self.refused: set[str] = set()  # phases whose files hold lines of another format version

    def _stored(self) -> tuple[dict[tuple[str, int], int], set[tuple[str, int, int]]]:
        """What earlier attempts stored: the highest seq per (phase, rank), and the evaluations' epochs (and the
        figures' window over their lines, once)."""
        with session_scope(self.database) as session:
            highest = session.exec(
                select(JobMetric.phase, JobMetric.rank, func.max(JobMetric.seq))
                .where(JobMetric.job_id == self.job_id, JobMetric.seq != EVAL_SEQ)
                .group_by(col(JobMetric.phase), col(JobMetric.rank))
            ).all()
            evals = session.exec(
                select(JobMetric.phase, JobMetric.rank, JobMetric.epoch).where(
                    JobMetric.job_id == self.job_id, JobMetric.seq == EVAL_SEQ
                )
            ).all()
            job = session.get(Job, self.job_id)
            self.samples_per_s = job.samples_per_s if job is not None else None  # a restarted worker keeps it
            self.window = FigureWindow.load(session, self.job_id, self.nproc)
        seqs = {(phase, rank): int(seq) for phase, rank, seq in highest}
        return seqs, {(phase, rank, epoch) for phase, rank, epoch in evals}

    def fresh(self, phase: str, line: TelemetryLine) -> bool:
        """Whether `line` was not stored before (and now counts as stored)."""
        rank, seq = line.rank, seq_of(line)
        if seq == EVAL_SEQ:
            key = (phase, rank, line.epoch)
            if key in self.stored_evals:
                return False
            self.stored_evals.add(key)
            return True
        highest = self.stored_seq.get((phase, rank))
        if highest is not None and seq <= highest:
            return False
        self.stored_seq[(phase, rank)] = seq
        return True

    def follower(self, phase: str) -> MetricsFollower | None:
        """The telemetry of `phase`, once it has a plan to read it against."""
        if phase not in PHASES_WITH_METRICS:
            return None
        if phase not in self.followers:
            self.followers[phase] = MetricsFollower(self.run_dir, phase)
        return self.followers[phase]

    def progress(self, phase: str, records: list[PhaseRecord]) -> Progress:
        """The job row's progress fields: the whole job's and `phase`'s fraction done, and samples/s as the last
        poll that stored lines computed it (app/core/figures.py: a finished job's row keeps its figures)."""
        follower = self.followers.get(phase)
        fraction = follower.progress.fraction if follower is not None else 0.0
        return {
            "progress": job_fraction(records, fraction),
            "phase_progress": fraction,
            "samples_per_s": self.samples_per_s,
        }

    def poll(self, phase: str, records: list[PhaseRecord]) -> int:
        """Store what is new in `phase`; returns the number of telemetry lines stored."""
        follower = self.follower(phase)
        new = [line for line in follower.poll() if self.fresh(phase, line)] if follower is not None else []
        if follower is not None and follower.refused and phase not in self.refused:
            self.refused.add(phase)  # said once per phase: the lines of an earlier PipeBD are passed over
            log.warning("job %s: telemetry lines of %s passed over: %s", self.job_id, phase, follower.refused)
        lines = self.unsent.pop(phase, []) + new
        grown = self.grown_logs(phase)
        if not lines and not grown:
            return 0
        pending = copy.deepcopy(self.rollups[phase].pending) if phase in self.rollups else None
        window = self.window.add(phase, [line for line in lines if not isinstance(line, EvalLine)])
        try:
            with session_scope(self.database) as session:
                self._fence(session)
                if lines:
                    self._store_metrics(session, lines, phase, records, window)
                for source, size in grown:
                    rank = None if source == LAUNCHER else int(source)
                    data = {"phase": phase, "rank": rank, "size": size}
                    session.add(JobEvent(job_id=self.job_id, kind="log", data=data))
        except DATABASE_DOWN:  # kept for the next poll, the rollups and window as they were: nothing lost or twice
            self.unsent[phase] = lines
            if pending is not None:
                self.rollups[phase].pending = pending
            raise
        self.window = window
        return len(lines)

    def _fence(self, session: Session) -> None:
        """Raise TakenOver (the transaction rolled back, nothing stored) when the job is no longer this worker's."""
        if self.holds is not None and not self.holds(session):
            raise TakenOver(f"job {self.job_id} is no longer this run's: claimed again elsewhere (or deleted)")

    def grown_logs(self, phase: str) -> list[tuple[str, int]]:
        """(source, size) of each log of `phase` that grew since the last poll."""
        sources = {LAUNCHER: self.run_dir.launcher_log(phase)}
        sources.update({str(rank): self.run_dir.log(rank, phase) for rank in range(self.nproc)})
        grown = []
        for source, path in sources.items():
            size = path.stat().st_size if path.exists() else 0
            if size > self.log_sizes.get((phase, source), 0):
                self.log_sizes[(phase, source)] = size
                grown.append((source, size))
        return grown

    def _store_metrics(
        self, session: Session, lines: list[TelemetryLine], phase: str, records: list[PhaseRecord], window: FigureWindow
    ) -> None:
        rows = [
            JobMetric(
                job_id=self.job_id,
                phase=phase,
                rank=line.rank,
                seq=seq_of(line),
                epoch=line.epoch,
                step=line.step,
                time=line.time,
                record=line.to_json(),
            )
            for line in lines
        ]
        session.add_all(rows)
        steps = [line for line in lines if not isinstance(line, EvalLine)]
        session.add_all(self.rollups[phase].add([to_point(line) for line in steps]))
        session.flush()
        job = session.get(Job, self.job_id)
        if job is not None:  # the figures over the lines stored so far, this poll's included, on the same row
            self.samples_per_s = store_figures(session, job, window).samples_per_s
        progress = self.progress(phase, records)
        ids = [row.id for row in rows if row.id is not None]
        data = {"first_id": min(ids), "last_id": max(ids), "phase": phase, **progress}
        session.add(JobEvent(job_id=self.job_id, kind="metrics", data=data))
        session.execute(update(Job).where(col(Job.id) == self.job_id).values(**progress))
