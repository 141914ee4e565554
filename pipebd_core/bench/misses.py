"""Where an accuracy record misses a target: by how much, and what its measurements show is the cause.

The targets (issue 40, on a quiet 2-core machine): MAPE at most max(5%, 1.25 x the noise floor)
(doubt.target); Kendall's tau at least TAU_TARGET of the phase (0.8 distillation, 0.7 end-to-end
training); the chosen plan the fastest measured or inside the noise of it. Every sentence is computed
from the record's predictions and measurements, from the profile alone (what the planner plans from):

- MAPE over its target: the plans off by more than the target, slow (predicted above the measurement)
  and fast, and the largest errors, so a reader sees whether the error is one-sided (a cost the model
  leaves out or counts twice) or scattered; and, where the record has both, the profile's own ideal
  step (all the work divided evenly) against the measured bound's (T1 / N): how far the blocks' costs as
  profiled are from what one rank doing all the work measured; and, where the record has its reference
  speed at the start (taken just before the profile is measured or read) and at the end, how much the machine's speed
  changed under the bench and whether that change points the way the plans are off (a machine slower
  after its profile than while profiling makes every plan's prediction fast); and, where the record has the
  reference speed after each run, how each run's error follows the machine's speed as it ran, and how fast
  the machine ran its runs (their median) against the moment it was profiled (the reference at the start,
  and right after the profile where the record has it): a profile measured while the machine was slower
  than in its runs predicts every plan slow;
- tau under its target: the pairs of plans the profile orders against the measurement where the
  measurement's order is clear of the noise (the two arms' intervals do not overlap);
- a chosen plan slower than the fastest beyond the noise: each one's prediction against its measurement.
"""

from __future__ import annotations

import statistics

from pipebd_core.bench.doubt import FigureDoubt, arm_interval, target
from pipebd_core.documents.bench_record import Arm, Bound, KernelSpeed, PlanAccuracy, Reference

TAU_TARGET = {"distill": 0.8, "finetune": 0.7}
SHOWN = 3  # the largest errors and the misordered pairs named
DRIFT = 0.05  # a change of the reference speed that counts: both kernels by more than the smallest MAPE target
MIN_RUNS_CORRELATED = 6  # runs with a reference speed after them needed to set their errors beside it
CORRELATED = 0.5  # a Pearson r from which the runs' errors are read as following the machine's speed


def relative_error(plan: PlanAccuracy) -> float:
    return (plan.predicted_step_s - plan.measured_step_s) / plan.measured_step_s


def bound_text(bound: Bound | None) -> str:
    """The profile's ideal step against the measured bound's, where the record has both."""
    if bound is None or bound.profile_ideal_s is None or bound.ideal_s is None:
        return ""
    off = bound.profile_ideal_s / bound.ideal_s - 1
    return (
        f" The profile's own ideal step ({bound.profile_ideal_s:.4g} s) is {off:+.0%} off the measured bound's"
        f" ({bound.ideal_s:.4g} s, T1 / N): the work as profiled costs {'more' if off > 0 else 'less'} than one"
        " rank doing all of it measured."
    )


def drift_text(reference: Reference | None, plans: list[PlanAccuracy]) -> str:
    """The machine's reference speed at the bench's end against its start, and whether the change points the
    way the plans' predictions are off on average."""
    if reference is None or reference.end is None or not plans:
        return ""
    start, end = reference.start, reference.end
    matmul, conv = end.matmul_gflops / start.matmul_gflops - 1, end.conv_gflops / start.conv_gflops - 1
    mean_error = statistics.mean(relative_error(plan) for plan in plans)
    said = (
        f" The machine's reference speed (one thread) changed {matmul:+.0%} (matmul) and {conv:+.0%} (conv) from"
        f" the bench's start (just before its profile was measured or read) to its end; the plans' mean error is"
        f" {mean_error:+.0%}"
    )
    if max(matmul, conv) < -DRIFT and mean_error < 0:
        reading = "a machine slower after its profile than while profiling predicts every plan fast, by up to that much"
    elif min(matmul, conv) > DRIFT and mean_error > 0:
        reading = "a machine faster after its profile than while profiling predicts every plan slow, by up to that much"
    else:
        reading = (
            "the change does not point the way the plans are off by more than 5%, so it does not explain the error"
        )
    return f"{said}: {reading}."


def combined(speed: KernelSpeed) -> float:
    """One figure for a reference measurement: the geometric mean of its two kernels' GFLOP/s."""
    return (speed.matmul_gflops * speed.conv_gflops) ** 0.5


def run_speed_text(reference: Reference | None, arms: dict[str, Arm] | None) -> str:
    """Each run's prediction error set beside the reference speed measured right after it (relative to the
    start's, the geometric mean of both kernels): their Pearson correlation over the runs, where the record has
    MIN_RUNS_CORRELATED such runs. A machine whose speed wanders makes the runs taken while it was slow come out
    slow, so their predictions fast: the correlation is then positive."""
    if reference is None or not reference.after_runs or not arms:
        return ""
    speeds = {measured.run: measured.speed for measured in reference.after_runs}
    start = reference.start
    pairs = []
    for arm in arms.values():
        for run in arm.runs:
            speed = speeds.get(f"{arm.name}-{run.repeat}")
            if speed is None or run.predicted_step_s is None:
                continue
            relative = combined(speed) / combined(start)
            pairs.append((relative, (run.predicted_step_s - run.measured_step_s) / run.measured_step_s))
    if len(pairs) < MIN_RUNS_CORRELATED:
        return ""
    relatives, errors = [pair[0] for pair in pairs], [pair[1] for pair in pairs]
    if statistics.pstdev(relatives) == 0 or statistics.pstdev(errors) == 0:
        return ""
    r = statistics.correlation(relatives, errors)
    reading = (
        "the runs taken while the machine was slower are the ones predicted fast: its wandering speed accounts for"
        " part of the error"
        if r >= CORRELATED
        else "the errors do not follow the machine's speed run by run"
    )
    return (
        f" The reference speed measured after each of {len(pairs)} runs ranged {min(relatives):.0%} to"
        f" {max(relatives):.0%} of the start's; against each run's own error, Pearson r = {r:+.2f}: {reading}."
    )


def profile_moment_text(reference: Reference | None, plans: list[PlanAccuracy]) -> str:
    """The machine's speed over the runs (the median of the reference after each) against its speed around the
    profile (at the start, and right after the profile where measured), and whether the difference points the
    way the plans' predictions are off on average."""
    if reference is None or len(reference.after_runs) < MIN_RUNS_CORRELATED or not plans:
        return ""
    around = [reference.start] + ([reference.after_profile] if reference.after_profile is not None else [])
    profiled = statistics.mean(combined(speed) for speed in around)
    ran = statistics.median(combined(measured.speed) for measured in reference.after_runs)
    change = ran / profiled - 1
    mean_error = statistics.mean(relative_error(plan) for plan in plans)
    moment = "just before and right after its profile" if len(around) == 2 else "just before its profile"
    said = (
        f" The reference speed (both kernels' geometric mean) read {profiled:.0f} GFLOP/s {moment} and a median of"
        f" {ran:.0f} after the runs ({change:+.0%}); the plans' mean error is {mean_error:+.0%}"
    )
    if change > DRIFT and mean_error > 0:
        reading = "a machine faster in its runs than while profiling predicts every plan slow, by up to that much"
    elif change < -DRIFT and mean_error < 0:
        reading = "a machine slower in its runs than while profiling predicts every plan fast, by up to that much"
    else:
        reading = "the difference does not point the way the plans are off by more than 5%, so it does not explain it"
    return f"{said}: {reading}."


def mape_miss(
    plans: list[PlanAccuracy],
    doubt: FigureDoubt,
    floor: float | None,
    bound: Bound | None = None,
    reference: Reference | None = None,
    arms: dict[str, Arm] | None = None,
) -> str | None:
    """The plans off by more than the MAPE target, by direction, the largest errors, the profile's ideal
    against the measured bound, and the machine's change of speed under the bench."""
    aim = target(floor)
    if doubt.mape is None or doubt.mape.value <= aim:
        return None
    slow = [plan.arm for plan in plans if relative_error(plan) > aim]
    fast = [plan.arm for plan in plans if relative_error(plan) < -aim]
    largest = sorted(plans, key=lambda plan: -abs(relative_error(plan)))[:SHOWN]
    named = ", ".join(f"{plan.arm} {relative_error(plan):+.0%}" for plan in largest)
    return (
        f"MAPE {doubt.mape.value - aim:.1%} over its target {aim:.1%}: of {len(plans)} plans, {len(slow)} predicted"
        f" slow by more than the target ({', '.join(slow) or 'none'}) and {len(fast)} fast"
        f" ({', '.join(fast) or 'none'}); the largest errors {named}."
        + bound_text(bound)
        + drift_text(reference, plans)
        + run_speed_text(reference, arms)
        + profile_moment_text(reference, plans)
    )


def misordered(plans: list[PlanAccuracy], arms: dict[str, Arm]) -> list[tuple[PlanAccuracy, PlanAccuracy]]:
    """Pairs (a, b) the profile predicts a faster than b where b measured faster, clear of the noise."""
    pairs = []
    for a in plans:
        for b in plans:
            reversed_order = a.predicted_step_s < b.predicted_step_s and a.measured_step_s > b.measured_step_s
            if reversed_order and not arm_interval(arms[a.arm]).overlaps(arm_interval(arms[b.arm])):
                pairs.append((a, b))
    return sorted(pairs, key=lambda pair: -(pair[0].measured_step_s / pair[1].measured_step_s))


def tau_miss(plans: list[PlanAccuracy], arms: dict[str, Arm], doubt: FigureDoubt, phase: str) -> str | None:
    """The pairs of plans the profile orders against a clear measurement."""
    aim = TAU_TARGET[phase]
    if doubt.rank_correlation is None or doubt.rank_correlation.value >= aim:
        return None
    pairs = misordered(plans, arms)
    named = "; ".join(
        f"{a.arm} predicted {1 - a.predicted_step_s / b.predicted_step_s:.0%} faster than {b.arm},"
        f" measured {a.measured_step_s / b.measured_step_s - 1:.0%} slower"
        for a, b in pairs[:SHOWN]
    )
    clear = f"{len(pairs)} pairs ordered against a measurement clear of the noise" + (f" ({named})" if named else "")
    if not pairs:
        clear += ": every misordered pair is inside the noise"
    return f"Kendall's tau {aim - doubt.rank_correlation.value:.2f} under its target {aim:.1f}: {clear}."


def regret_miss(plans: list[PlanAccuracy], chosen: str, doubt: FigureDoubt) -> str | None:
    """The chosen plan and the fastest measured, each predicted against measured."""
    if doubt.chosen_fastest or doubt.regret_in_noise or doubt.regret is None:
        return None
    by_arm = {plan.arm: plan for plan in plans}
    pick, best = by_arm[chosen], min(plans, key=lambda plan: plan.measured_step_s)
    return (
        f"The chosen plan {pick.arm} measured {doubt.regret.value:.1%} slower than {best.arm}, beyond the noise:"
        f" {pick.arm} predicted {pick.predicted_step_s:.4g} s, measured {pick.measured_step_s:.4g} s"
        f" ({relative_error(pick):+.0%}); {best.arm} predicted {best.predicted_step_s:.4g} s, measured"
        f" {best.measured_step_s:.4g} s ({relative_error(best):+.0%})."
    )


def miss_lines(
    plans: list[PlanAccuracy],
    arms: dict[str, Arm],
    chosen: str,
    doubt: FigureDoubt,
    floor: float | None,
    phase: str,
    bound: Bound | None = None,
    reference: Reference | None = None,
) -> list[str]:
    """The paragraph on the targets the profile's predictions miss, or nothing when every target is met."""
    misses = [mape_miss(plans, doubt, floor, bound, reference, arms), tau_miss(plans, arms, doubt, phase)]
    misses.append(regret_miss(plans, chosen, doubt))
    found = [miss for miss in misses if miss is not None]
    return ["Where it misses (from the profile alone): " + " ".join(found)] if found else []
