"""How much a benchmark's figures can be trusted: intervals over the repeats, and the noise floor.

The repeats of a bench are interleaved (arms.py): repeat r ran every arm once, close in time. So every
figure computed from one repeat's measurements (a speed-up, MAPE, Kendall's tau, a regret) has one
value a repeat: the figure given is their median, its interval the lowest to the highest, with their
count (min-max: with three repeats a bootstrap would only re-draw the same three values).

The noise floor: how well one repeat of an arm predicts another repeat of the same arm, the MAPE of the
measurement against itself,

    floor = mean over every arm a with two repeats or more, and every ordered pair (i, j), i != j, of
            |m[a][i] - m[a][j]| / m[a][j]

(m[a][i]: arm a's measured step in repeat i). No prediction can be judged finer than that: the honest
target for a prediction's MAPE is max(5%, 1.25 x floor) (`target`: the tolerance of
planning/calibration_guard.py, which keeps a calibration from claiming more than that).
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from pipebd_core.documents.bench_record import Arm, PlanAccuracy
from pipebd_core.planning.calibration_guard import agrees, tolerance


@dataclass(frozen=True)
class Interval:
    """A figure's median over `count` repeats, and its lowest and highest value."""

    value: float
    low: float
    high: float
    count: int

    def text(self, form: Callable[[float], str]) -> str:
        return f"{form(self.value)} [{form(self.low)}, {form(self.high)}; {self.count} repeats]"

    def overlaps(self, other: Interval) -> bool:
        return self.low <= other.high and other.low <= self.high


def mape(pairs: Sequence[tuple[float, float]]) -> float:
    """Mean absolute percentage error of (predicted, measured) pairs, as a fraction."""
    if not pairs:
        raise ValueError("mape: no (predicted, measured) pairs; it needs at least one plan that ran")
    return statistics.fmean(abs(predicted - measured) / measured for predicted, measured in pairs)


def kendall_tau(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Kendall's tau-b of two paired sequences (ties counted as neither agreeing nor disagreeing, and
    taken out of the denominator); None under two pairs or when either sequence is all ties."""
    if len(xs) != len(ys):
        raise ValueError(f"kendall_tau: {len(xs)} values against {len(ys)}; give paired sequences")
    concordant = discordant = tied_x = tied_y = 0
    for i in range(len(xs)):
        for j in range(i + 1, len(xs)):
            dx, dy = xs[i] - xs[j], ys[i] - ys[j]
            if dx == 0 and dy == 0:
                continue
            if dx == 0:
                tied_x += 1
            elif dy == 0:
                tied_y += 1
            elif (dx > 0) == (dy > 0):
                concordant += 1
            else:
                discordant += 1
    pairs = concordant + discordant
    denominator = math.sqrt((pairs + tied_x) * (pairs + tied_y))
    return (concordant - discordant) / denominator if denominator else None


def regret(chosen_s: float, measured: Sequence[float]) -> float:
    """How much slower the chosen plan measured than the fastest: chosen / best - 1."""
    return chosen_s / min(measured) - 1


@dataclass(frozen=True)
class FigureDoubt:
    """MAPE, Kendall's tau and the chosen plan's regret over the repeats (None: no repeat every arm ran,
    or tau undefined in every repeat)."""

    mape: Interval | None
    rank_correlation: Interval | None
    regret: Interval | None
    chosen_fastest: bool  # the chosen plan is the arm with the fastest median
    regret_in_noise: bool  # it is not, but its interval overlaps the fastest arm's


def figure_doubt(predicted: Mapping[str, float], arms: Mapping[str, Arm], chosen: str) -> FigureDoubt:
    """The figures of `predicted` (by arm) against `arms`' measurements, one a repeat."""
    arms = {name: arms[name] for name in predicted}
    names = list(predicted)
    by_repeat = repeats(arms)
    mapes = [mape([(predicted[n], steps[n]) for n in names]) for steps in by_repeat]
    taus = [kendall_tau([predicted[n] for n in names], [steps[n] for n in names]) for steps in by_repeat]
    regrets = [regret(steps[chosen], list(steps.values())) for steps in by_repeat]
    fastest = min(names, key=lambda name: arms[name].step_s)
    return FigureDoubt(
        mape=over_repeats(mapes),
        rank_correlation=over_repeats([tau for tau in taus if tau is not None]),
        regret=over_repeats(regrets),
        chosen_fastest=chosen == fastest,
        regret_in_noise=chosen != fastest and arm_interval(arms[chosen]).overlaps(arm_interval(arms[fastest])),
    )


def apply_guard(plans: Sequence[PlanAccuracy], floor: float | None) -> list[PlanAccuracy]:
    """`plans` with `calibration_applied` set by the guard (planning/calibration_guard.py): a plan's
    calibration applies where its calibrated prediction agrees with the profile's within the tolerance
    the noise `floor` sets."""
    within = tolerance(floor)
    return [
        plan.model_copy(update={"calibration_applied": agrees(plan.predicted_step_s, plan.calibrated_step_s, within)})
        if plan.calibrated_step_s is not None
        else plan
        for plan in plans
    ]


def guarded_predictions(plans: Sequence[PlanAccuracy]) -> dict[str, float]:
    """Per plan with a calibration, the prediction the calibrated figures use: the calibrated one where
    the guard applied it (or, in a record from before the guard, always), else the profile's."""
    return {
        plan.arm: plan.calibrated_step_s if plan.calibration_applied is not False else plan.predicted_step_s
        for plan in plans
        if plan.calibrated_step_s is not None
    }


def over_repeats(per_repeat: Sequence[float]) -> Interval | None:
    """The median of `per_repeat` and its range; None without a repeat."""
    if not per_repeat:
        return None
    return Interval(statistics.median(per_repeat), min(per_repeat), max(per_repeat), len(per_repeat))


def noise_floor(arms: Sequence[Arm]) -> float | None:
    """The module's formula: the mean relative difference of every ordered pair of one arm's repeats;
    None when no arm has two repeats."""
    errors = []
    for arm in arms:
        steps = [run.measured_step_s for run in arm.runs]
        errors += [abs(a - b) / b for a, b in itertools.permutations(steps, 2)]
    return statistics.fmean(errors) if errors else None


def target(floor: float | None) -> float:
    """The MAPE a prediction can honestly be held to: max(5%, 1.25 x the noise floor)."""
    return tolerance(floor)


def repeats(arms: Mapping[str, Arm]) -> list[dict[str, float]]:
    """Per repeat that every arm of `arms` ran, each arm's measured step in it."""
    common = set.intersection(*({run.repeat for run in arm.runs} for arm in arms.values())) if arms else set()
    by_repeat = []
    for repeat in sorted(common):
        by_repeat.append(
            {name: next(r.measured_step_s for r in arm.runs if r.repeat == repeat) for name, arm in arms.items()}
        )
    return by_repeat


def speedup(arm: Arm, baseline: Arm) -> Interval | None:
    """baseline / arm in every repeat both ran."""
    return over_repeats(
        [steps[baseline.name] / steps[arm.name] for steps in repeats({a.name: a for a in (arm, baseline)})]
    )


def arm_interval(arm: Arm) -> Interval:
    low, high = arm.interval
    return Interval(arm.step_s, low, high, len(arm.runs))
