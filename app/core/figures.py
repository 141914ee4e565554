"""A job's figures as the service stores and shows them: pipebd_core/figures.py's definitions over the
telemetry lines stored for the job.

The worker computes them in the transaction that stores a poll's lines (`store_figures`, over the
`FigureWindow` it keeps as the lines stream in) and writes them on the job's row (`samples_per_s`,
`busy_share`, `peak_mem`), so the row and the lines never disagree; the job page, the jobs list, Compare,
the API, the CLI and the Prometheus gauge read the row, and the measured step is `step_of(job)`. A job's
figures are its distillation's; a job that only trains end to end has its fine-tuning's (its ranks time no
waits: no busy share).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from sqlmodel import Session, col, select

from app.core.tables import EVAL_SEQ, Job, JobMetric
from pipebd_core.documents.phases import DISTILL, FINETUNE
from pipebd_core.documents.telemetry import StepLine, step_line
from pipebd_core.figures import RECENT_TASKS, Figures, step_s


def batch_size_of(job: Job) -> int:
    return int(job.spec.get("data", {}).get("batch_size") or 1)


def num_blocks_of(job: Job) -> int:
    return int((job.plan_summary or {}).get("num_blocks") or 1)


def recent_lines(
    session: Session, job_id: int, world_size: int, phase: str = DISTILL, per_rank: int = RECENT_TASKS
) -> dict[int, list[StepLine]]:
    """The newest `per_rank` step lines of `phase` of each rank, oldest first (one indexed query per rank)."""
    result: dict[int, list[StepLine]] = {}
    for rank in range(world_size):
        query = (
            select(JobMetric.record)
            .where(JobMetric.job_id == job_id, JobMetric.phase == phase, JobMetric.rank == rank)
            .where(col(JobMetric.seq) != EVAL_SEQ)
            .order_by(col(JobMetric.seq).desc())
            .limit(per_rank)
        )
        steps = [step_line(phase, record) for record in session.exec(query).all()]
        if steps:
            result[rank] = steps[::-1]
    return result


@dataclass(frozen=True)
class FigureWindow:
    """Each rank's newest RECENT_TASKS step lines of each phase with figures, oldest first: what a job's figures
    are computed over. The worker keeps one as the lines stream in (worker/streaming.py), read from the database
    once when it starts following the job, so no poll reads the stored lines back."""

    lines: dict[str, dict[int, list[StepLine]]] = field(default_factory=dict)  # phase -> rank -> window

    @classmethod
    def load(cls, session: Session, job_id: int, world_size: int) -> FigureWindow:
        """The window over the lines the database holds for the job."""
        return cls({phase: recent_lines(session, job_id, world_size, phase) for phase in (DISTILL, FINETUNE)})

    def add(self, phase: str, steps: Sequence[StepLine]) -> FigureWindow:
        """This window with `steps` (lines of `phase` just stored, each rank's in order) appended; itself unchanged,
        so that a transaction that fails leaves the window as it was."""
        if not steps:
            return self
        ranks = {rank: list(window) for rank, window in self.lines.get(phase, {}).items()}
        for line in steps:
            ranks.setdefault(line.rank, []).append(line)
        return FigureWindow({**self.lines, phase: {rank: window[-RECENT_TASKS:] for rank, window in ranks.items()}})

    def figures(self, job: Job) -> Figures:
        """The job's figures: its distillation's, else its fine-tuning's."""
        phase = DISTILL if self.lines.get(DISTILL) else FINETUNE
        lines = self.lines.get(phase, {})
        return Figures.of(lines, num_blocks_of(job) if phase == DISTILL else 1, batch_size_of(job))


def store_figures(session: Session, job: Job, window: FigureWindow | None = None) -> Figures:
    """Compute the job's figures and write them on its row (in the caller's transaction: the worker's, beside the
    lines it just stored). `window`: the lines stored so far as the worker keeps them; default: read back."""
    if window is None:
        assert job.id is not None
        window = FigureWindow.load(session, job.id, job.world_size)
    figures = window.figures(job)
    job.samples_per_s, job.busy_share, job.peak_mem = figures.samples_per_s, figures.busy_share, figures.peak_mem
    session.add(job)
    return figures


def step_of(job: Job) -> float | None:
    """The job's measured step (seconds a global batch takes through every block) from its stored samples/s."""
    return step_s(batch_size_of(job), job.samples_per_s)
