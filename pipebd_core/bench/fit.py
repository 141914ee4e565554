"""`pipebd bench --minutes M`: the steps and repeats that fit a bench into M minutes, from the profile's
predictions and one short run that measures what they leave out.

A run takes its start-up (torchrun, the ranks building the network, the plan phase, the warm-up steps' excess,
the last checkpoint: what no profile predicts) plus its steps times its arm's step. Before it fits, a fresh
bench runs its first arm for MIN_STEPS steps twice (the probe, not recorded): the first pays once what no
later run pays (the agent server's imports of torch and the workload: a tiny ViT's probe took 8 s where its
runs then took 2-3 s, and the fit chose 7 repeats it had time for twice over); the second's wall time less
its steps is the start-up of every run, and its measured step over its predicted one scales every arm's
prediction (a
VGG-16 finetune run started in 28 s and stepped up to 1.7x slower than predicted, against the 20 s start-up
and the predictions a fit once assumed). Where no probe runs (a resumed bench, the unit tests) the start-up is
LAUNCH_S. A repeat runs every arm once. The choice: at least the repeats asked for (MIN_REPEATS by default),
as many steps as fit up to the steps asked for; where the steps asked for fit with time to spare, more repeats
(up to MAX_REPEATS), since doubt shrinks with repeats. A budget that does not hold MIN_STEPS steps at those
repeats is refused, saying how many minutes would.
"""

from __future__ import annotations

import math
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pipebd_core.bench.arms import WARMUP_STEPS
from pipebd_core.documents.bench_record import ArmRun, BenchRecord
from pipebd_core.spec import SpecError

LAUNCH_S = 20.0  # seconds a run costs beyond its steps, where no probe measured it (15-20 s a tiny run here)
FASTEST_LAUNCH_S = 5.0  # the least a run's start-up has been measured at: a budget below that is refused unprobed
SCALE_LIMITS = (0.5, 3.0)  # a probe's measured / predicted step, held within these
PROBE = "probe"  # the probe run's folder in the bench's, removed once it is read
MIN_STEPS = WARMUP_STEPS + 4  # the fewest steps a run of a fitted bench times (4 timed)
MIN_REPEATS = 3  # the fewest repeats: an interval of three runs, not two
MAX_REPEATS = 9  # spare time beyond this many repeats is left unused


@dataclass(frozen=True)
class Fit:
    """What `--minutes` chose."""

    minutes: float
    steps: int
    repeats: int
    predicted_s: float  # the whole bench, predicted
    arms: int  # runs a repeat (the bound included)
    basis: str  # what the prediction rests on (`assumed`, or a probe's `basis()`)

    def says(self) -> str:
        return (
            f"--minutes {self.minutes:g}: {self.steps} steps a run, {self.repeats} repeats of {self.arms} arms"
            f" (the bound included), predicted {self.predicted_s / 60:.1f} minutes ({self.basis})"
        )


@dataclass(frozen=True)
class Probe:
    """One short run of the bench's first arm before it fits (see the module's docstring)."""

    arm: str
    steps: int
    wall_s: float
    step_s: float  # measured, the timed steps' mean
    predicted_step_s: float | None
    spent_s: float | None = None  # the wall time of every probe run, the one before the measured run included

    @property
    def counted_s(self) -> float:
        """What the probe took of the bench's minutes."""
        return self.wall_s if self.spent_s is None else self.spent_s

    @property
    def launch_s(self) -> float:
        """What the run cost beyond its steps at their measured mean."""
        return max(0.0, self.wall_s - self.steps * self.step_s)

    @property
    def scale(self) -> float:
        """Its measured step over its predicted one (1 without a prediction), within SCALE_LIMITS."""
        if not self.predicted_step_s:
            return 1.0
        low, high = SCALE_LIMITS
        return min(high, max(low, self.step_s / self.predicted_step_s))

    def basis(self) -> str:
        spent = f"{self.wall_s:.0f} s" if self.spent_s is None else f"{self.spent_s:.0f} s with the run before it"
        return (
            f"{assumed(self.launch_s)} x {self.scale:.2f}, measured by"
            f" a {self.steps}-step run of {self.arm} ({spent}, counted in the minutes)"
        )


def predicted_s(step_s: dict[str, float], steps: int, repeats: int, launch_s: float = LAUNCH_S) -> float:
    """The bench's predicted seconds: every arm `repeats` times, each run start-up and `steps` steps."""
    return repeats * sum(launch_s + steps * step for step in step_s.values())


def fit(
    step_s: dict[str, float],
    minutes: float,
    max_steps: int,
    repeats: int = MIN_REPEATS,
    launch_s: float = LAUNCH_S,
    probe: Probe | None = None,
) -> Fit:
    """Steps and repeats for arms whose predicted steps are `step_s` (by arm, the bound's included) within
    `minutes`, each run starting in `launch_s`; with `probe`, its start-up and scale instead, in the minutes
    left after it. A SpecError that says what would fit when nothing does."""
    if probe is not None:
        said = f"--minutes {minutes:g}, {probe.counted_s:.0f} s of them spent on a probe run of {probe.arm}"
        left = minutes - probe.counted_s / 60
        if left <= 0:
            raise SpecError(f"{said}: nothing is left for the bench; give more minutes")
        try:
            scaled = {arm: step * probe.scale for arm, step in step_s.items()}
            fitted = fit(scaled, left, max_steps, repeats, probe.launch_s)
        except SpecError as error:
            raise SpecError(f"{said} ({probe.basis()}): {error}") from None
        whole = fitted.predicted_s + probe.counted_s
        return Fit(minutes, fitted.steps, fitted.repeats, whole, fitted.arms, probe.basis())
    if minutes <= 0 or not step_s:
        raise SpecError(f"--minutes {minutes:g}: give a positive number of minutes for a bench with arms")
    repeats = max(repeats, MIN_REPEATS)
    budget, per_step = minutes * 60, sum(step_s.values())
    fewest = min(MIN_STEPS, max_steps)  # --steps below MIN_STEPS: the steps asked for, or nothing
    steps = min(max_steps, math.floor((budget / repeats - launch_s * len(step_s)) / per_step))
    if steps < fewest:
        needed = predicted_s(step_s, fewest, repeats, launch_s)
        raise SpecError(
            f"--minutes {minutes:g}: {len(step_s)} arms x {repeats} repeats need at least"
            f" {math.ceil(needed / 60)} minutes for {fewest} steps a run ({assumed(launch_s)});"
            " give more minutes or fewer arms (--modes)"
        )
    while repeats < MAX_REPEATS and predicted_s(step_s, steps, repeats + 1, launch_s) <= budget:
        repeats += 1
    return Fit(minutes, steps, repeats, predicted_s(step_s, steps, repeats, launch_s), len(step_s), assumed(launch_s))


def assumed(launch_s: float) -> str:
    """What a fit's prediction rests on, said the one way every message says it."""
    return f"{launch_s:.0f} s start-up a run and the profile's predicted steps"


@dataclass(frozen=True)
class Budget:
    """The steps and repeats a bench runs, and what `--minutes` said of them (for the record's `fitted`)."""

    steps: int
    repeats: int
    fitted: str | None


def budget(
    steps: int,
    repeats: int,
    minutes: float | None,
    resume: BenchRecord | None,
    predicted: Callable[[], dict[str, float]],
    probe: Callable[[int], Probe] | None = None,
) -> Budget:
    """The preamble of every bench with arms: without `minutes`, the steps and repeats asked for (a resumed bench
    keeps its record's `fitted`); with them, those that fit (`predicted`: each arm's predicted step, the bound's
    included, asked for only then; `probe(steps)`: a short run of the first arm, measured first, unless a budget
    that the fastest start-up could not hold is refused before it), said on stderr."""
    if minutes is None:
        return Budget(steps, repeats, resume.fitted if resume else None)
    step_s = predicted()
    if probe is None:
        fitted = fit(step_s, minutes, steps, repeats)
    else:
        fit(step_s, minutes, steps, repeats, FASTEST_LAUNCH_S)  # nothing run for a budget nothing could hold
        fitted = fit(step_s, minutes, steps, repeats, probe=probe(min(MIN_STEPS, steps)))
    print(f"pipebd: {fitted.says()}", file=sys.stderr)
    return Budget(fitted.steps, fitted.repeats, fitted.says())


def probing(out: Path, arm: str, run: Callable[[int, Path], ArmRun]) -> Callable[[int], Probe]:
    """The probe of a bench writing to `out`: `run(steps, folder)` runs its first arm, `arm`, that many steps in
    `folder` (out/PROBE, removed once read: the probe is in no record), twice; the second run is measured."""

    def probe(steps: int) -> Probe:
        walls = []
        for _ in range(2):
            folder = out / PROBE
            shutil.rmtree(folder, ignore_errors=True)
            try:
                done = run(steps, folder)
            finally:
                shutil.rmtree(folder, ignore_errors=True)
            walls.append(done.load.wall_s)
        return Probe(arm, steps, done.load.wall_s, done.measured_step_s, done.predicted_step_s, sum(walls))

    return probe
