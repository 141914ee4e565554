"""Follow a running phase from its telemetry files: progress, losses and throughput, computed once here.

`pipebd run` draws its progress line from a `MetricsFollower` of each phase that trains (distill,
finetune), and the service's workers store the same numbers; both read a phase's fraction from
`phase_fraction` and a job's from `phases.job_fraction`, so the CLI and the dashboard never disagree
(resumed runs included).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipebd_core import figures
from pipebd_core.documents.base import DocumentError
from pipebd_core.documents.phases import DISTILL
from pipebd_core.documents.telemetry import DistillLine, EvalLine, FileTail, StepLine, TelemetryLine, read_line
from pipebd_core.figures import RECENT_TASKS
from pipebd_core.rundir import RunDir


@dataclass(frozen=True)
class TaskCounts:
    """A phase's tasks over all ranks: done by this attempt, done before it (resumed), in all."""

    done: int
    skipped: int
    whole: int

    @classmethod
    def of(cls, latest: dict[int, StepLine], nproc: int) -> TaskCounts:
        """From each rank's latest line: `done` of this attempt's `total` tasks, and `skipped`, what an
        earlier attempt did. A rank that has not reported yet counts as nothing done of the largest
        whole reported."""
        if not latest:
            return cls(0, 0, 1)
        wholes = [line.total + line.skipped for line in latest.values()]
        done = sum(line.done for line in latest.values())
        skipped = sum(line.skipped for line in latest.values())
        return cls(done, skipped, max(1, sum(wholes) + max(wholes) * (nproc - len(latest))))


def phase_fraction(latest: dict[int, StepLine], nproc: int) -> float:
    """The fraction of a phase's tasks done, resumed ones included (see TaskCounts.of)."""
    counts = TaskCounts.of(latest, nproc)
    return min(1.0, (counts.done + counts.skipped) / counts.whole)


@dataclass(frozen=True)
class PhaseSize:
    """What a phase's progress is counted against: its ranks, its steps and the global batch."""

    nproc: int
    total_steps: int
    batch_size: int
    num_blocks: int = 1  # the network's blocks (a distillation line's samples are a share of them)

    @classmethod
    def of(cls, run_dir: RunDir, phase: str) -> PhaseSize:
        """From the phase's plan: plan.json for distillation, finetune_plan.json for end-to-end training."""
        if phase == DISTILL:
            plan = run_dir.load_plan()
            return cls(plan.nproc, plan.total_steps, plan.batch_size, plan.num_blocks)
        finetune = run_dir.load_finetune_plan()
        return cls(finetune.nproc, finetune.steps.total_steps, finetune.batch_size)


@dataclass
class Progress:
    """The latest state of every rank of a phase, folded from their telemetry lines."""

    size: PhaseSize
    latest: dict[int, StepLine] = field(default_factory=dict)
    recent: dict[int, list[StepLine]] = field(default_factory=dict)  # each rank's newest RECENT_TASKS lines
    losses: dict[str, float] = field(default_factory=dict)  # per block (distill), or "network" (finetune)

    def add(self, line: TelemetryLine) -> None:
        if isinstance(line, EvalLine):  # an evaluation, not a step
            return
        self.latest[line.rank] = line
        window = self.recent.setdefault(line.rank, [])
        window.append(line)
        del window[:-RECENT_TASKS]
        if isinstance(line, DistillLine):
            self.losses.update({str(block): value for block, value in line.loss.items()})
        elif line.loss is not None:
            self.losses["network"] = line.loss

    @property
    def fraction(self) -> float:
        return phase_fraction(self.latest, self.size.nproc)

    def samples_per_s(self) -> float | None:
        """Samples taken through every block (the whole network) per second: pipebd_core/figures.py's
        definition, the one the service shows; None before the first step."""
        return figures.samples_per_s(self.recent, self.size.num_blocks)

    def describe(self) -> str:
        slowest = min(self.latest.values(), key=lambda line: line.done / max(1, line.total), default=None)
        where = f"epoch {slowest.epoch} step {slowest.step}" if slowest else "starting"
        what = "loss" if "network" in self.losses else "mean block loss"
        loss = f"{sum(self.losses.values()) / len(self.losses):.4g}" if self.losses else "—"  # none before a step
        speed = self.samples_per_s()
        rate = f"{speed:.1f} samples/s" if speed is not None else "— samples/s"
        return f"{self.fraction:6.1%} {where} | {what} {loss} | {rate}"


class MetricsFollower:
    """Tails metrics/<phase>/rank-*.jsonl of a run and keeps a Progress up to date.

    A line of another format version (a run directory an earlier PipeBD wrote into, resumed) is passed
    over rather than ending the job that follows it: what it says was stored by the attempt that wrote
    it. `refused` keeps the first such line's DocumentError message, for whoever follows to report.
    """

    def __init__(self, run_dir: RunDir, phase: str = DISTILL) -> None:
        size = PhaseSize.of(run_dir, phase)
        self.phase = phase
        self.tails = [FileTail(run_dir.metrics(rank, phase)) for rank in range(size.nproc)]
        self.progress = Progress(size)
        self.refused: str | None = None

    def poll(self) -> list[TelemetryLine]:
        lines = []
        for tail in self.tails:
            for text in tail.read_new():
                try:
                    line = read_line(self.phase, text)
                except DocumentError as error:
                    self.refused = self.refused or str(error)
                    continue
                self.progress.add(line)
                lines.append(line)
        return lines
