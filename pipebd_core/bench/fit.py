"""`pipebd bench --minutes M`: the steps and repeats that fit a bench into M minutes, from the profile's
predictions.

A run is predicted to take LAUNCH_S (torchrun, the ranks importing torch and building the network, the
plan phase, the last checkpoint: what no profile predicts) plus its steps times its arm's predicted
step. A repeat runs every arm once. The choice: at least the repeats asked for (MIN_REPEATS by
default), as many steps as fit up to the steps asked for; where the steps asked for fit with time to
spare, more repeats (up to MAX_REPEATS), since doubt shrinks with repeats. A budget that does not hold
MIN_STEPS steps at those repeats is refused, saying how many minutes would.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass

from pipebd_core.bench.arms import WARMUP_STEPS
from pipebd_core.documents.bench_record import BenchRecord
from pipebd_core.spec import SpecError

LAUNCH_S = 20.0  # seconds a run costs beyond its steps on this 2-core machine (measured: 15-20 s a tiny run)
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

    def says(self) -> str:
        return (
            f"--minutes {self.minutes:g}: {self.steps} steps a run, {self.repeats} repeats of {self.arms} arms"
            f" (the bound included), predicted {self.predicted_s / 60:.1f} minutes"
            f" ({LAUNCH_S:.0f} s start-up a run and the profile's predicted steps)"
        )


def predicted_s(step_s: dict[str, float], steps: int, repeats: int, launch_s: float = LAUNCH_S) -> float:
    """The bench's predicted seconds: every arm `repeats` times, each run start-up and `steps` steps."""
    return repeats * sum(launch_s + steps * step for step in step_s.values())


def fit(
    step_s: dict[str, float], minutes: float, max_steps: int, repeats: int = MIN_REPEATS, launch_s: float = LAUNCH_S
) -> Fit:
    """Steps and repeats for arms whose predicted steps are `step_s` (by arm, the bound's included) within
    `minutes`; a SpecError that says what would fit when nothing does."""
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
            f" {math.ceil(needed / 60)} minutes for {fewest} steps a run ({launch_s:.0f} s start-up a run and"
            " the profile's predicted steps); give more minutes or fewer arms (--modes)"
        )
    while repeats < MAX_REPEATS and predicted_s(step_s, steps, repeats + 1, launch_s) <= budget:
        repeats += 1
    return Fit(minutes, steps, repeats, predicted_s(step_s, steps, repeats, launch_s), len(step_s))


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
) -> Budget:
    """The preamble of every bench with arms: without `minutes`, the steps and repeats asked for (a resumed bench
    keeps its record's `fitted`); with them, those that fit (`predicted`: each arm's predicted step, the bound's
    included, asked for only then), said on stderr."""
    if minutes is None:
        return Budget(steps, repeats, resume.fitted if resume else None)
    fitted = fit(predicted(), minutes, steps, repeats)
    print(f"pipebd: {fitted.says()}", file=sys.stderr)
    return Budget(fitted.steps, fitted.repeats, fitted.says())
