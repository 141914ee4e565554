"""A training phase's telemetry as scalar series: the one naming TensorBoard and MLflow both show.

Every series is named `<phase>/<what>` (TensorBoard groups a run's charts by the part before the first
slash), and each of its points has an integer step and the wall time of the last line it stands for:

    distill/loss/block_<b>          step: the global optimiser step; the mean over the ranks reporting
                                    block b at that step (a block replicated over ranks reports once each)
    finetune/loss, finetune/train_acc   likewise, over the ranks that compute a loss (a pipeline: the last stage)
    finetune/top1                   rank 0's evaluation after `step` (EvalLine)
    finetune/perplexity             likewise, a language model's held-out perplexity (workload kind transformer)
    <phase>/samples_per_s           samples taken through the whole network per second (pipebd_core/figures.py's
                                    samples), in windows of wall time (about WINDOWS of them); step: seconds
                                    since the phase began
    <phase>/memory_mib/rank_<r>     the rank's memory in use, and .../peak_mib/rank_<r> its peak so far;
    <phase>/gpu_util/rank_<r>       percent (CUDA ranks); step: the rank's task count (`seq`, which only grows)

A step of a resumed phase redone after the checkpoint it resumed from is counted once: of two lines of
one rank with one `seq`, the later one stands. Architecture rounds of a NAS search report no block loss
here (the dashboard leaves them out too). Every series is in step order, as TensorBoard needs.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from pipebd_core.data.streams import even_ranges
from pipebd_core.documents.phases import DISTILL
from pipebd_core.documents.telemetry import DistillLine, EvalLine, StepLine, TelemetryLine, read_line
from pipebd_core.figures import network_samples, task_seconds
from pipebd_core.job.progress import PhaseSize
from pipebd_core.rundir import RunDir

MIB = 1024 * 1024
WINDOWS = 200  # samples/s: the phase's wall time cut into about this many windows
MIN_WINDOW_S = 1.0  # ... each at least a second, so that a window's step (its end, in seconds) is its own


@dataclass(frozen=True)
class Scalar:
    """One point of one series: `tag` at `step` is `value`, as of `time` (seconds since the epoch)."""

    tag: str
    step: int
    value: float
    time: float


def latest_lines(lines: Iterable[TelemetryLine]) -> tuple[list[StepLine], list[EvalLine]]:
    """The step lines and evaluations that stand: per rank and `seq` (per rank and epoch for an evaluation),
    the last one written, in the order they were first written."""
    steps: dict[tuple[int, int], StepLine] = {}
    evals: dict[tuple[int, int], EvalLine] = {}
    for line in lines:
        if isinstance(line, EvalLine):
            evals[(line.rank, line.epoch)] = line
        else:
            steps[(line.rank, line.seq)] = line
    return list(steps.values()), list(evals.values())


class Series:
    """Points gathered by (tag, step): values at one step are averaged, the latest time kept."""

    def __init__(self) -> None:
        self.sums: dict[tuple[str, int], float] = defaultdict(float)
        self.counts: dict[tuple[str, int], int] = defaultdict(int)
        self.times: dict[tuple[str, int], float] = {}

    def add(self, tag: str, step: int, value: float, time: float) -> None:
        if not math.isfinite(value):  # a diverged loss: TensorBoard and MLflow refuse NaN and infinities alike
            return
        key = (tag, step)
        self.sums[key] += value
        self.counts[key] += 1
        self.times[key] = max(time, self.times.get(key, time))

    def scalars(self) -> list[Scalar]:
        """Every point, by tag then step."""
        return [
            Scalar(tag, step, self.sums[(tag, step)] / self.counts[(tag, step)], self.times[(tag, step)])
            for tag, step in sorted(self.sums)
        ]


def phase_scalars(phase: str, lines: Iterable[TelemetryLine], num_blocks: int = 1) -> list[Scalar]:
    """The series of a training phase from its ranks' telemetry lines (`num_blocks`: the network's blocks,
    which a distillation line's samples are a share of)."""
    steps, evals = latest_lines(lines)
    series = Series()
    for line in steps:
        _add_step(series, phase, line)
    for evaluation in evals:
        if evaluation.top1 is not None:
            series.add(f"{phase}/top1", evaluation.step, evaluation.top1, evaluation.time)
        if evaluation.perplexity is not None:
            series.add(f"{phase}/perplexity", evaluation.step, evaluation.perplexity, evaluation.time)
    for step, value, time in throughput(steps, num_blocks if phase == DISTILL else 1):
        series.add(f"{phase}/samples_per_s", step, value, time)
    return series.scalars()


def _add_step(series: Series, phase: str, line: StepLine) -> None:
    if isinstance(line, DistillLine):
        if line.round == "weights":
            for block, loss in line.loss.items():
                series.add(f"{phase}/loss/block_{block}", line.step, loss, line.time)
    else:
        if line.loss is not None:
            series.add(f"{phase}/loss", line.step, line.loss, line.time)
        if line.acc is not None:
            series.add(f"{phase}/train_acc", line.step, line.acc, line.time)
    series.add(f"{phase}/memory_mib/rank_{line.rank}", line.seq, line.cur_mem / MIB, line.time)
    series.add(f"{phase}/peak_mib/rank_{line.rank}", line.seq, line.peak_mem / MIB, line.time)
    if isinstance(line, DistillLine) and line.gpu_util is not None:
        series.add(f"{phase}/gpu_util/rank_{line.rank}", line.seq, line.gpu_util, line.time)


def throughput(steps: list[StepLine], num_blocks: int) -> list[tuple[int, float, float]]:
    """(seconds since the first line, samples per second, window end) per window of wall time with work in
    it: each line adds its samples times the share of the network it trained (its blocks of `num_blocks`;
    a finetune step trains the whole network) to the window it was written in."""
    timed = [(line.time, network_samples(line, num_blocks)) for line in steps if line.samples is not None]
    if not timed:
        return []
    start = min(time for time, _ in timed) - min(task_seconds(line) for line in steps)
    span = max(time for time, _ in timed) - start
    width = max(MIN_WINDOW_S, span / WINDOWS)
    last = max(0, math.ceil(span / width) - 1)
    windows: dict[int, float] = defaultdict(float)
    for time, samples in timed:  # a line is written when its task ends: in the window that ends at or after it
        windows[min(last, max(0, math.ceil((time - start) / width) - 1))] += samples
    return [
        (round((index + 1) * width), samples / width, start + (index + 1) * width)
        for index, samples in sorted(windows.items())
    ]


def thinned(scalars: list[Scalar], max_points: int) -> list[Scalar]:
    """At most `max_points` points per series (in tag then step order): a longer series is cut into that many
    consecutive buckets, each one point at its last step and time with the bucket's mean value."""
    result: list[Scalar] = []
    for _, group in itertools.groupby(scalars, key=lambda point: point.tag):
        series = list(group)
        if len(series) <= max_points:
            result.extend(series)
            continue
        for start, stop in even_ranges(len(series), max_points):
            bucket = series[start:stop]
            mean = sum(point.value for point in bucket) / len(bucket)
            result.append(Scalar(bucket[-1].tag, bucket[-1].step, mean, bucket[-1].time))
    return result


def read_phase(run_dir: RunDir, phase: str) -> list[TelemetryLine]:
    """Every telemetry line the ranks of `phase` wrote, rank by rank; a line of another format version (a
    run directory an earlier PipeBD wrote into) or one still being written is passed over."""
    lines: list[TelemetryLine] = []
    for rank in range(PhaseSize.of(run_dir, phase).nproc):
        path = run_dir.metrics(rank, phase)
        for text in path.read_text().splitlines() if path.exists() else []:
            try:
                lines.append(read_line(phase, text))
            except ValueError:  # DocumentError included
                continue
    return lines


def run_scalars(run_dir: RunDir, phase: str) -> list[Scalar]:
    """The series of training phase `phase` of a run, from its telemetry files."""
    num_blocks = run_dir.load_plan().num_blocks if phase == DISTILL else 1
    return phase_scalars(phase, read_phase(run_dir, phase), num_blocks)
