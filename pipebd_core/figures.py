"""One definition per figure: samples/s, busy share, measured step, peak memory, speed-up and its noise.

Every figure a job shows (its page, the jobs list, Compare, the API, the CLI, `pipebd run`'s progress line
and the exports) is computed here from the ranks' telemetry lines of one training phase, over each rank's
newest RECENT_TASKS tasks (a window: a job's start, data loading and compilation do not drag it down):

| figure        | definition                                                                                    |
|---------------|-----------------------------------------------------------------------------------------------|
| samples/s     | samples taken through the whole network per second: over each rank's window, the samples its   |
|               | tasks trained times the share of the network they trained (blocks / the network's blocks; a   |
|               | fine-tuning step trains all of it), divided by the window's wall time; summed over the ranks  |
| measured step | the global batch over samples/s: seconds one batch takes through every block                  |
| busy share    | per rank, the share of its window's wall time it does not wait for other ranks (recv_wait,    |
|               | barrier) nor sit idle between tasks; a job's is its busiest rank's (distillation only)         |
| peak memory   | the largest peak any rank reported (CUDA max allocated, or the peak resident set on the CPU)   |
| speed-up      | one job's samples/s over another's; `within noise` when the ratio lies inside the two jobs'    |
|               | spread (`spread`: how much their own steps' pace varies)                                      |

A window's wall time runs from the start of its first task (the line's time less the task's seconds) to
the end of its last; never less than the tasks' own seconds.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pipebd_core.documents.telemetry import DistillLine, StepLine
from pipebd_core.rundir import STEP_PHASES

RECENT_TASKS = 40  # each rank's newest tasks behind every figure
WAITS = ("recv_wait", "barrier")  # waiting for other ranks: not busy
BETWEEN = "between"  # a rank's time between its tasks, outside every timed phase

Lines = Mapping[int, Sequence[StepLine]]  # rank -> its lines of one phase, oldest first


def network_samples(line: StepLine, num_blocks: int) -> float:
    """Samples through the whole network that `line` stands for: its rows times the share of the network it
    trained (a distillation task's blocks of `num_blocks`; a fine-tuning step trains all of it)."""
    share = len(line.blocks) / max(1, num_blocks) if isinstance(line, DistillLine) else 1.0
    return (line.samples or 0) * share


def task_seconds(line: StepLine) -> float:
    """The seconds the line's task took."""
    return sum(line.phases.values()) if isinstance(line, DistillLine) else line.elapsed


def window_s(lines: Sequence[StepLine]) -> float:
    """Wall time from the first task's start to the last task's end (at least the tasks' own seconds)."""
    start = lines[0].time - task_seconds(lines[0])
    return max(lines[-1].time - start, sum(task_seconds(line) for line in lines), 1e-9)


def recent(lines: Lines, tasks: int = RECENT_TASKS) -> dict[int, list[StepLine]]:
    """Each rank's newest `tasks` lines (the window every figure is computed over)."""
    return {rank: list(rank_lines)[-tasks:] for rank, rank_lines in lines.items() if rank_lines}


def samples_per_s(lines: Lines, num_blocks: int) -> float | None:
    """Samples through the whole network per second, summed over the ranks' windows; None without lines."""
    windows = recent(lines)
    if not windows:
        return None
    return sum(
        sum(network_samples(line, num_blocks) for line in window) / window_s(window) for window in windows.values()
    )


def step_s(batch_size: int, speed: float | None) -> float | None:
    """The measured step: seconds one global batch takes through every block at `speed` samples/s."""
    return batch_size / speed if speed else None


def peak_mem(lines: Lines) -> int | None:
    """The largest peak memory any rank reported, in bytes; None without lines."""
    peaks = [line.peak_mem for rank_lines in lines.values() for line in rank_lines]
    return max(peaks) if peaks else None


@dataclass
class RankLoad:
    """How one rank spent its window's wall time (distillation lines: their phases are timed)."""

    rank: int
    blocks: list[int]
    tasks: int
    wall_s: float
    phase_s: dict[str, float]

    def share(self, phase: str) -> float:
        if phase == BETWEEN:
            return max(0.0, self.wall_s - sum(self.phase_s.values())) / self.wall_s
        return self.phase_s.get(phase, 0.0) / self.wall_s

    @property
    def busy_share(self) -> float:
        """The busy share: everything but waiting for other ranks and the gaps between tasks."""
        return max(0.0, 1.0 - sum(self.share(phase) for phase in (*WAITS, BETWEEN)))

    def shares(self) -> list[tuple[str, float]]:
        """(phase, share) in execution order, then the time between tasks; only non-zero ones."""
        items = [(phase, self.share(phase)) for phase in (*STEP_PHASES, BETWEEN)]
        return [(phase, share) for phase, share in items if share > 0.0005]

    def largest(self, phases: tuple[str, ...]) -> tuple[str, float]:
        return max(((phase, self.share(phase)) for phase in phases), key=lambda item: item[1])


def rank_load(rank: int, lines: Sequence[DistillLine]) -> RankLoad | None:
    """One rank's load over its window (its newest RECENT_TASKS lines); None without lines."""
    window = list(lines)[-RECENT_TASKS:]
    if not window:
        return None
    phase_s = dict.fromkeys(STEP_PHASES, 0.0)
    trained: set[int] = set()
    for line in window:
        for phase, seconds in line.phases.items():
            phase_s[phase] = phase_s.get(phase, 0.0) + seconds
        trained.update(line.blocks)
    return RankLoad(rank, sorted(trained), len(window), window_s(window), phase_s)


def rank_loads(lines: Lines) -> list[RankLoad]:
    """The load of every rank with distillation lines, by rank."""
    loads = []
    for rank, rank_lines in sorted(lines.items()):
        distill = [line for line in rank_lines if isinstance(line, DistillLine)]
        load = rank_load(rank, distill)
        if load is not None:
            loads.append(load)
    return loads


def busy_share(lines: Lines) -> float | None:
    """A job's busy share: its busiest rank's; None without distillation lines."""
    loads = rank_loads(lines)
    return max(load.busy_share for load in loads) if loads else None


def spread(lines: Lines) -> float | None:
    """How much a job's pace varies from task to task: the standard deviation of the logarithm of the time
    between a rank's consecutive task ends, each rank measured against its own mean, pooled over the ranks
    (0.1: steps commonly 10% apart). None with fewer than three intervals in all."""
    deviations: list[float] = []
    for rank_lines in recent(lines).values():
        logs = [
            math.log(later.time - earlier.time)
            for earlier, later in itertools.pairwise(rank_lines)
            if later.time > earlier.time
        ]
        if len(logs) >= 2:
            mean = statistics.fmean(logs)
            deviations += [value - mean for value in logs]
    if len(deviations) < 3:
        return None
    return math.sqrt(sum(value * value for value in deviations) / (len(deviations) - 1))


@dataclass(frozen=True)
class Speedup:
    """One job's samples/s over a baseline's, and whether the difference lies inside their spread."""

    ratio: float
    within_noise: bool

    def text(self) -> str:
        return "within noise" if self.within_noise else f"\u00d7{self.ratio:.2f}"


def speedup(speed: float, spread_of: float | None, baseline: float, baseline_spread: float | None) -> Speedup:
    """`speed` over `baseline` (samples/s); within noise when |log ratio| is at most the two spreads combined
    (sqrt(a² + b²)); a job whose spread is unknown counts as none."""
    ratio = speed / baseline
    noise = math.hypot(spread_of or 0.0, baseline_spread or 0.0)
    return Speedup(ratio, abs(math.log(ratio)) <= noise)


@dataclass(frozen=True)
class Figures:
    """A job's figures from its lines of one phase (see the table above)."""

    samples_per_s: float | None
    step_s: float | None
    busy_share: float | None
    peak_mem: int | None
    spread: float | None

    @classmethod
    def of(cls, lines: Lines, num_blocks: int, batch_size: int) -> Figures:
        speed = samples_per_s(lines, num_blocks)
        return cls(speed, step_s(batch_size, speed), busy_share(lines), peak_mem(lines), spread(lines))
