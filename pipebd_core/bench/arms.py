"""What every benchmark of runs shares: the rotation of its arms, the one timing rule, and one run of an
arm in its own run directory under the load meter.

The rotation: each repeat runs every arm once (the bound's included), the order rotated by one each
repeat, so the slow drifts of a shared machine spread over every arm. The timing rule, for every mode
and strategy alike: a run's first WARMUP_STEPS global steps are left out; every later step is timed
from the ranks' own telemetry (each line is written as a task ends: a task took from the end of the
rank's task before it), a rank's step is the sum of its tasks of that step, and the run's steps are
those of its slowest rank (the one whose timed steps took longest in all): the pace the run kept. Not
each step's slowest rank: a decoupled pipeline's ranks alternate long and short steps out of phase,
and the slowest at every step overstated such a run by a quarter (NAS, tr_dpu, 2 ranks: 0.262 s a step
against both ranks' pace of 0.205). Process start-up never counts, nor does the first step of an end-to-end training
epoch: its time holds the previous epoch's checkpoint and evaluation, which no schedule changes and no
prediction includes.
"""

from __future__ import annotations

import shutil
import statistics
from collections import defaultdict
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from pipebd_core.bench.conditions import LoadMeter
from pipebd_core.documents.base import Document
from pipebd_core.documents.bench_record import SLOWEST_RANK, ArmRun, Load, TimingRule
from pipebd_core.documents.telemetry import DistillLine, FinetuneLine
from pipebd_core.job.launch import prepare_run
from pipebd_core.job.outcomes import SUCCEEDED
from pipebd_core.job.supervisor import Supervisor
from pipebd_core.rundir import RunDir
from pipebd_core.spec import Spec, SpecError

WARMUP_STEPS = 2  # global steps left out of every run's timing, whatever its mode or strategy
BOUND = "bound"  # the arm that measures T1: one rank doing all the work of a global step
RUN_TIMEOUT_S = 3600.0
RECORD = "bench.json"  # in the bench's --out folder
FROZEN_PROFILE = "frozen-profile.json"  # likewise: the profile every arm planned from

StepLine = DistillLine | FinetuneLine


def check_steps(steps: int) -> None:
    if steps <= WARMUP_STEPS:
        raise SpecError(f"bench: --steps {steps} leaves nothing to time after {WARMUP_STEPS} warm-up steps; use more")


def own_seconds(line: StepLine) -> float:
    """The seconds of the task a line ends (a rank's first task is timed from its own start)."""
    return line.elapsed if isinstance(line, FinetuneLine) else sum(line.phases.values())


def rank_step_s(lines: Sequence[StepLine], warmup: int, left_out: Collection[int]) -> dict[int, float]:
    """One rank's seconds of every global step from `warmup` on but those `left_out`, by step: each task
    timed from the end of the rank's task before it, a step the sum of its tasks."""
    mine: dict[int, float] = defaultdict(float)
    previous: float | None = None
    for line in lines:
        started = previous if previous is not None else line.time - own_seconds(line)
        if line.step >= warmup and line.step not in left_out:
            mine[line.step] += line.time - started
        previous = line.time
    return dict(sorted(mine.items()))


def timed_step_s(
    metrics: Sequence[Sequence[StepLine]], warmup: int = WARMUP_STEPS, left_out: Collection[int] = ()
) -> dict[int, float]:
    """Seconds of every global step from `warmup` on but those `left_out`, by step, by the module's timing
    rule: the steps of the rank whose timed steps took longest in all (the run's pace)."""
    ranks = [steps for lines in metrics if (steps := rank_step_s(lines, warmup, left_out))]
    return max(ranks, key=lambda steps: statistics.fmean(steps.values()), default={})


@dataclass(frozen=True)
class Finished:
    """A run that succeeded: its run directory, the load meanwhile, and its timed steps."""

    run_dir: RunDir
    load: Load


def freeze(profile: Document, out: Path) -> str:
    """Keep the profile every arm plans from beside the record (FROZEN_PROFILE); its hash."""
    out.mkdir(parents=True, exist_ok=True)
    (out / FROZEN_PROFILE).write_text(profile.model_dump_json(indent=1))
    return profile.digest()


def run_in_own_dir(spec: Spec, out: Path, phases: list[str], profile: tuple[Path, str] | None) -> Finished:
    """Run `phases` of `spec` in a run directory of its own, `profile` (its path there, its JSON text)
    written into it first; the supervisor leaves the profile cache alone."""
    run_dir = prepare_run(spec, out, phases=phases)
    if profile is not None:
        profile[0].write_text(profile[1])
    meter = LoadMeter.open()
    outcome = Supervisor(run_dir, time_limit_s=RUN_TIMEOUT_S, store_calibration=False).run()
    load = meter.load()
    if outcome.result != SUCCEEDED:
        raise RuntimeError(f"bench: {out.name} {outcome.result} in {outcome.phase}: {outcome.error}")
    return Finished(run_dir, load)


def epoch_starts(per_epoch: int, steps: int) -> list[int]:
    """The steps that begin an end-to-end training epoch after the first: the timing rule leaves them out."""
    return list(range(per_epoch, steps, per_epoch))


def timed(
    metrics: Sequence[Sequence[StepLine]], where: RunDir, left_out: Collection[int] = ()
) -> tuple[list[float], TimingRule]:
    """The run's timed steps, in order, and the timing they were found with (`left_out`: steps not timed)."""
    steps = timed_step_s(metrics, left_out=left_out)
    if not steps:
        raise RuntimeError(f"bench: no telemetry past the {WARMUP_STEPS} warm-up steps in {where.root}")
    skipped = sorted(step for step in left_out if min(steps) <= step <= max(steps))
    return list(steps.values()), timing_rule(min(steps), len(steps), skipped)


def timing_rule(warmup: int, timed: int, left_out: Sequence[int] = ()) -> TimingRule:
    """The rule this module times by, as a record states it."""
    return TimingRule(warmup_steps=warmup, timed_steps=timed, left_out=list(left_out), pace=SLOWEST_RANK)


Run = TypeVar("Run", bound=ArmRun)


def rotation(names: Sequence[str], repeats: int) -> list[tuple[str, int]]:
    """(arm, repeat) of every run in the order they run: each repeat every arm, rotated by one each repeat."""
    names = list(names)
    order = []
    for repeat in range(repeats):
        order += [(name, repeat) for name in names[repeat % len(names) :] + names[: repeat % len(names)]]
    return order


def rotate(
    arms: dict[str, Spec],
    repeats: int,
    out: Path,
    keep: bool,
    run: Callable[[str, Spec, Path, int], Run],
    done: dict[str, list[Run]] | None = None,
    written: Callable[[dict[str, list[Run]], list[str]], None] | None = None,
) -> dict[str, list[Run]]:
    """Every arm `repeats` times, the order rotated each repeat; a run's folder is out/<arm>-<repeat>.
    The runs in `done` (a bench resumed) are not run again; after every run `written(runs, left)` gets
    the runs so far and the folders of those left to run (progress.py writes the record)."""
    order = rotation(list(arms), repeats)
    runs: dict[str, list[Run]] = {name: list((done or {}).get(name, [])) for name in arms}
    finished = {(name, run.repeat) for name, arm_runs in runs.items() for run in arm_runs}
    left = [(name, repeat) for name, repeat in order if (name, repeat) not in finished]
    if written is not None:
        written(runs, [f"{name}-{repeat}" for name, repeat in left])  # the record exists from the start
    for index, (name, repeat) in enumerate(left):
        folder = out / f"{name}-{repeat}"
        shutil.rmtree(folder, ignore_errors=True)  # what a stopped bench left of this run
        runs[name].append(run(name, arms[name], folder, repeat))
        runs[name].sort(key=lambda done_run: done_run.repeat)  # a run measured again goes back to its place
        if not keep:
            shutil.rmtree(folder, ignore_errors=True)
        if written is not None:
            written(runs, [f"{other}-{again}" for other, again in left[index + 1 :]])
    return runs
