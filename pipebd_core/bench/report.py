"""The benchmarks page's tables, rendered from benchmark records (`pipebd bench --report FILE...`).

Pure and deterministic: the same records give the same markdown, byte for byte, so the page can be
regenerated and compared. Every figure carries its repeats: an arm's step is the median of its runs,
listed beside it with their spread ((highest - lowest) / median); its interval is its lowest to its
highest run. A comparison with the baseline (dp; ddp or pipedream for end-to-end training) whose
intervals overlap says so instead of giving a ratio, and so does the line naming the fastest arm. An
arm with a run measured while other processes used more than the record's `shared_cores` is marked
shared in its row. End-to-end training's tables add each rank's bubble. A record of `pipebd bench
--accuracy` adds its accuracy table: every candidate plan's prediction from the profile alone and
calibrated on another run, against what it measured, the figures over them (MAPE, Kendall's tau, the
chosen plan's regret) and where they miss a target, by how much and why (misses.py); an end-to-end
training one also its partitions table (partitions.py).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from pipebd_core.bench.doubt import (
    FigureDoubt,
    apply_guard,
    figure_doubt,
    guarded_predictions,
    noise_floor,
    speedup,
    target,
)
from pipebd_core.bench.misses import miss_lines
from pipebd_core.bench.partitions import partitions_lines
from pipebd_core.documents.bench_record import (
    SLOWEST_RANK,
    Accuracy,
    Arm,
    ArmRun,
    BenchRecord,
    Bound,
    KernelSpeed,
    PlanAccuracy,
    Reference,
    TimingRule,
)
from pipebd_core.documents.distill_plan import StageSpan, stages_line

TITLES = {
    "modes": "distillation",
    "strategies": "end-to-end training, the strategies",
    "partitioners": "end-to-end training, the partitioners",
    "plans": "distillation, the planner's predictions checked",
}


def load_record(path: Path) -> BenchRecord:
    """The record in `path`; DocumentError (or JSONDecodeError) when it holds no benchmark record."""
    return BenchRecord.from_json(json.loads(path.read_text()))


def render(records: list[BenchRecord]) -> str:
    """Markdown for every record, in the order given."""
    return "\n".join(render_record(record) for record in records)


def render_record(record: BenchRecord) -> str:
    title = TITLES[record.compares] + (f" ({record.strategy})" if record.strategy else "")
    if not record.complete:
        return incomplete(record, title)
    if record.compares == "plans" and record.phase == "finetune":
        title = "end-to-end training, the planner's predictions checked"
    head = ["arm", "plan", "s/step: median (runs)", "spread", "samples/s", f"vs {record.baseline}", "efficiency"]
    head += ["predicted s/step", "error", "peak MiB per rank", "other cores (runs)"]
    head += ["bubble per rank"] if bubbles(record) else []
    lines = [f"### {record.name}: {title} on {record.nproc} ranks", "", describe(record), ""]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    baseline = next((arm for arm in record.arms if arm.name == record.baseline), None)
    lines += [arm_row(record, arm, baseline) for arm in record.arms]
    lines += [bound_row(record), "", bound_line(record), "", fastest_line(record.arms), ""]
    lines += [floor_line(record.arms), ""]
    if record.split_cost is not None:
        lines += [f"Split backward, (I + W) / B over the layers: {record.split_cost:.2f}.", ""]
    if record.accuracy is not None:
        arms = {arm.name: arm for arm in record.arms}
        lines += accuracy_lines(record.accuracy, arms, record.phase, record.bound, record.reference)
    lines += partitions_lines(record)
    return "\n".join(lines)


def incomplete(record: BenchRecord, title: str) -> str:
    """A bench still under way (or stopped): how far it got; no figure until every run has run."""
    done = sum(len(arm.runs) for arm in record.arms) + len(record.bound.runs)
    return (
        f"### {record.name}: {title} on {record.nproc} ranks\n\nIncomplete: {done} runs done,"
        f" {len(record.runs_left)} left ({', '.join(record.runs_left)}); `pipebd bench --resume` on this record"
        " runs them.\n"
    )


def accuracy_lines(
    accuracy: Accuracy,
    arms: dict[str, Arm],
    phase: str,
    bound: Bound | None = None,
    reference: Reference | None = None,
) -> list[str]:
    """The accuracy table: each candidate's predictions against its measured step, then the figures, each
    with its interval over the repeats, beside the noise floor and the target it sets, and where they miss
    a target, by how much and why (misses.py)."""
    head = ["plan", "from", "stages", "measured s/step", "predicted", "error", "calibrated", "error", "calibrated on"]
    lines = ["#### Predictions checked", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += [accuracy_row(plan) for plan in accuracy.plans]
    floor = noise_floor([arms[plan.arm] for plan in accuracy.plans])
    alone = figure_doubt({plan.arm: plan.predicted_step_s for plan in accuracy.plans}, arms, accuracy.chosen)
    lines += ["", "From the profile alone: " + doubt_text(alone, accuracy.chosen, "the planner's first plan", floor)]
    misses = miss_lines(accuracy.plans, arms, accuracy.chosen, alone, floor, phase, bound, reference)
    lines += [part for miss in misses for part in ("", miss)]
    if accuracy.calibrated is None:
        lines += ["", "Calibrated: no run wrote a calibration.", ""]
        return lines
    rule = f"{accuracy.rule}; seed {accuracy.seed}"
    calibrated_s = guarded_predictions(accuracy.plans)
    chosen = accuracy.calibrated.chosen
    calibrated = doubt_text(figure_doubt(calibrated_s, arms, chosen), chosen, "the lowest calibrated prediction", floor)
    lines += ["", f"Calibrated out of sample ({rule}): {calibrated}", ""]
    if any(plan.calibration_applied is None for plan in accuracy.plans if plan.calibrated_step_s is not None):
        lines += [guard_line(accuracy, arms, floor), ""]  # a record from before the guard
    return lines


def guard_line(accuracy: Accuracy, arms: dict[str, Arm], floor: float | None) -> str:
    """What the guard (planning/calibration_guard.py) makes of a record's calibrated predictions that were
    all applied: which it keeps, and the figures then."""
    guarded = apply_guard(accuracy.plans, floor)
    calibrated_s = guarded_predictions(guarded)
    chosen = min(calibrated_s, key=lambda arm: calibrated_s[arm])
    kept = [plan.arm for plan in guarded if plan.calibration_applied is False]
    figures = doubt_text(figure_doubt(calibrated_s, arms, chosen), chosen, "the lowest guarded prediction", floor)
    return (
        f"With the guard (this record predates it: a calibration applied only within {target(floor):.1%} of the"
        f" profile's prediction; the profile's kept for {', '.join(kept) or 'no plan'}): {figures}"
    )


def floor_line(arms: list[Arm]) -> str:
    """The noise floor of the arms' repeats (doubt.py) and the MAPE target it sets."""
    floor = noise_floor(arms)
    if floor is None:
        return "Noise floor: not measured (no arm has two repeats)."
    return (
        f"Noise floor (one repeat of an arm predicting another of the same arm, MAPE): {floor:.1%}; a"
        f" prediction's target is max(5%, 1.25 x floor) = {target(floor):.1%}."
    )


def doubt_text(doubt: FigureDoubt, chosen: str, how: str, floor: float | None) -> str:
    """MAPE, Kendall's tau and the chosen plan's regret, each with its interval over the repeats, in words."""
    percent = "{:.1%}".format
    mape = doubt.mape.text(percent) if doubt.mape else "-"
    aim = target(floor)
    if doubt.mape is not None:
        verdict = "within" if doubt.mape.value <= aim else f"{doubt.mape.value - aim:.1%} over"
        mape += f" ({verdict} the target {aim:.1%}" + (f", noise floor {floor:.1%})" if floor is not None else ")")
    tau = doubt.rank_correlation.text("{:.2f}".format) if doubt.rank_correlation else "-"
    regret = doubt.regret.text(percent) if doubt.regret else "-"
    if doubt.chosen_fastest:
        slower = f"the fastest measured (regret {regret})"
    elif doubt.regret_in_noise:
        slower = f"{regret} slower than the fastest measured, inside the noise (their intervals overlap)"
    else:
        slower = f"{regret} slower than the fastest measured"
    return f"MAPE {mape}, Kendall's tau {tau}, chosen plan {chosen} ({how}) {slower}."


def accuracy_row(plan: PlanAccuracy) -> str:
    names = " = ".join([plan.arm, *plan.also])
    calibrated = plan.calibrated_step_s
    cells = [names, plan.source, stages_text(plan.stages), seconds(plan.measured_step_s)]
    cells += [seconds(plan.predicted_step_s), error(plan.predicted_step_s, plan.measured_step_s)]
    cells += [seconds(calibrated), error(calibrated, plan.measured_step_s)] if calibrated is not None else ["-", "-"]
    cells.append((plan.calibrated_from or "-") + (" (not applied)" if plan.calibration_applied is False else ""))
    return "| " + " | ".join(cells) + " |"


def error(predicted: float, measured: float) -> str:
    return f"{(predicted - measured) / measured:+.0%}"


def bubbles(record: BenchRecord) -> bool:
    return any(run.bubble is not None for arm in record.arms for run in arm.runs)


def describe(record: BenchRecord) -> str:
    machine = record.machine
    gpus = ", ".join(machine.gpus) if machine.gpus else "no GPU"
    timing = record.timing
    repeats = "1 repeat" if record.repeats == 1 else f"{record.repeats} repeats interleaved"
    skipped = ", ".join(str(step) for step in timing.left_out)
    which = "step" if len(timing.left_out) == 1 else "steps"
    timed = f"{timing.timed_steps} timed" + (f" ({which} {skipped} left out: an epoch's first)" if skipped else "")
    return (
        f"Commit `{record.commit or 'unknown'}`; {machine.cores} x {machine.cpu_model} ({flags_text(record)}),"
        f" {gpus}, {machine.memory_bytes / 2**30:.0f} GiB, Python {machine.python}, torch {machine.torch};"
        f" {reference_text(record)}."
        f" Batch {record.batch_size}, {record.steps} steps a run ({timing.warmup_steps} warm-up, then"
        f" {timed}, every arm alike, {pace_text(timing)}), {repeats}; every arm planned from profile"
        f" `{record.profile_hash}`. {shared_line(record)}"
    )


def pace_text(timing: TimingRule) -> str:
    """Which rank's steps a run's are (TimingRule.pace)."""
    if timing.pace == SLOWEST_RANK:
        return "each run's steps its slowest rank's"
    return "each step its slowest rank's, the earlier rule, which overstates decoupled pipelines"


def flags_text(record: BenchRecord) -> str:
    flags = record.machine.cpu_flags
    if flags is None:
        return "CPU flags not recorded"
    return " ".join(flags) if flags else "no AVX-512 or AMX"


def speed_text(speed: KernelSpeed) -> str:
    return f"{speed.matmul_gflops:.1f} / {speed.conv_gflops:.1f}"


def reference_text(record: BenchRecord) -> str:
    """The reference speed at the bench's start and end (reference.py), or that it was not measured."""
    reference = record.reference
    if reference is None:
        return "reference speed not measured (the record predates it)"
    end = speed_text(reference.end) if reference.end is not None else "not reached"
    between = ""
    if reference.after_runs:
        speeds = [measured.speed for measured in reference.after_runs]
        matmul, conv = [s.matmul_gflops for s in speeds], [s.conv_gflops for s in speeds]
        between = (
            f", {min(matmul):.0f}-{max(matmul):.0f} / {min(conv):.0f}-{max(conv):.0f} after its {len(speeds)} runs"
        )
    return (
        f"reference speed, one thread, matmul / conv GFLOP/s: {speed_text(reference.start)} at the start{between},"
        f" {end} at the end"
    )


def shared_line(record: BenchRecord) -> str:
    """How many runs were measured while the machine was busy (marked **shared** in their rows)."""
    runs = [run for arm in record.arms for run in arm.runs] + record.bound.runs
    shared = sum(run.load.shared for run in runs)
    rule = f"more than {record.shared_cores:g} cores used by other processes"
    if not shared:
        return f"Quiet: no run had {rule}."
    return f"Shared: {shared} of {len(runs)} runs had {rule} (marked **shared**)."


def arm_row(record: BenchRecord, arm: Arm, baseline: Arm | None) -> str:
    first = arm.runs[0]
    predicted = first.predicted_step_s
    error = f"{(predicted - arm.step_s) / arm.step_s:+.0%}" if predicted else "-"
    cells = [
        arm.name + (" **shared**" if any(run.load.shared for run in arm.runs) else ""),
        plans(arm.runs),
        measured(arm),
        spread(arm),
        f"{record.batch_size / arm.step_s:.1f}",
        versus(arm, baseline),
        f"{record.bound.ideal_s / arm.step_s:.0%}" if record.bound.ideal_s is not None else "-",
        seconds(predicted) if predicted else "-",
        error,
        peak_memory(arm.runs),
        loads(arm.runs),
    ]
    if bubbles(record):
        cells.append(bubble(arm.runs))
    return "| " + " | ".join(cells) + " |"


def peak_memory(runs: list[ArmRun]) -> str:
    """Each rank's peak memory, the largest over the runs (on CPU the process's resident set)."""
    peaks = [max(rank) for rank in zip(*(run.peak_mem_bytes for run in runs), strict=True)]
    return ", ".join(f"{peak / 2**20:.0f}" for peak in peaks) if peaks else "-"


def bubble(runs: list[ArmRun]) -> str:
    """Each rank's bubble, the median over the runs."""
    shares = [run.bubble for run in runs if run.bubble is not None]
    return ", ".join(f"{statistics.median(rank):.0%}" for rank in zip(*shares, strict=True)) if shares else "-"


def bound_row(record: BenchRecord) -> str:
    bound = Arm(name="bound", runs=record.bound.runs)
    label = "T1: 1 rank, all the work" + (" **shared**" if any(run.load.shared for run in bound.runs) else "")
    cells = [label, plans(bound.runs), measured(bound), spread(bound)]
    cells += [f"{record.batch_size / bound.step_s:.1f}", "-", "-", "-", "-", peak_memory(bound.runs), loads(bound.runs)]
    cells += [bubble(bound.runs)] if bubbles(record) else []
    return "| " + " | ".join(cells) + " |"


def bound_line(record: BenchRecord) -> str:
    bound = record.bound
    if bound.t1_s is None or bound.ideal_s is None:
        return "Measured bound: not measured yet."
    work = "every teacher and student block" if record.phase == "distill" else "the whole network, the full batch"
    line = (
        f"Measured bound: T1 = {seconds(bound.t1_s)} s a step (one rank doing all the work of a global step:"
        f" {work}), ideal = T1 / {record.nproc} = {seconds(bound.ideal_s)} s; efficiency = ideal / measured step."
    )
    if bound.profile_ideal_s is not None:
        line += (
            f" The profile's own ideal (its prediction of perfectly divided work, not a bound):"
            f" {seconds(bound.profile_ideal_s)} s."
        )
    return line


def schedule_of(arm: Arm) -> tuple[str | None, str, bool] | None:
    """What an arm ran, where every repeat ran the same stages: its strategy, its stages and whether it is
    `tr` (whose barrier makes the same stages another schedule); None without stages (dp, ls)."""
    lines = {stages_line(run.stages) for run in arm.runs}
    if len(lines) != 1 or not arm.runs[0].stages:
        return None
    return arm.runs[0].strategy, lines.pop(), arm.name == "tr"


def fastest_line(arms: list[Arm]) -> str:
    """The fastest arm, or the arms whose intervals overlap its own, or that ran the very same schedule
    (then no ranking between them: their difference is noise)."""
    best = min(arms, key=lambda arm: arm.step_s)
    schedule = schedule_of(best)
    same = [arm.name for arm in arms if arm is not best and schedule is not None and schedule_of(arm) == schedule]
    if same:
        return (
            f"Fastest: not ranked; {best.name} ran the same schedule as {', '.join(same)}, so the difference"
            " between them is noise."
        )
    tied = [arm.name for arm in arms if arm is not best and overlap(arm, best)]
    if tied:
        return f"Fastest: not ranked; {best.name}'s interval overlaps {', '.join(tied)}'s."
    if len(best.runs) < 2:
        return f"Fastest: {best.name}, from a single run (no interval)."
    return f"Fastest: {best.name}, its interval clear of every other arm's."


def overlap(a: Arm, b: Arm) -> bool:
    (a_low, a_high), (b_low, b_high) = a.interval, b.interval
    return a_low <= b_high and b_low <= a_high


def versus(arm: Arm, baseline: Arm | None) -> str:
    """Speed against the baseline (its step over this one's) with its range over the repeats, unless their
    intervals overlap."""
    if baseline is None:
        return "-"
    if arm is not baseline and overlap(arm, baseline):
        return f"overlaps {baseline.name}"
    ratio = speedup(arm, baseline)
    if ratio is None or arm is baseline or ratio.count < 2:
        return f"{baseline.step_s / arm.step_s:.2f}x"
    return f"{ratio.value:.2f}x ({ratio.low:.2f}-{ratio.high:.2f})"


def measured(arm: Arm) -> str:
    runs = ", ".join(seconds(run.measured_step_s) for run in arm.runs)
    return f"{seconds(arm.step_s)} ({runs})"


def seconds(value: float) -> str:
    """Four significant digits: 1.234, 0.04125."""
    return f"{value:.4g}"


def spread(arm: Arm) -> str:
    if len(arm.runs) < 2:
        return "1 run"
    low, high = arm.interval
    return f"{(high - low) / arm.step_s:.0%}"


def loads(runs: list[ArmRun]) -> str:
    return ", ".join(f"{run.load.other_cores:.2f}" + (" shared" if run.load.shared else "") for run in runs)


def plans(runs: list[ArmRun]) -> str:
    """The stages each run ran (once when every run ran the same); '-' for dp and ls, which have none."""
    seen: list[str] = []
    for run in runs:
        text = (f"{run.strategy}: " if run.strategy else "") + stages_text(run.stages)
        if text not in seen:
            seen.append(text)
    return " / ".join(seen)


def stages_text(stages: list[StageSpan]) -> str:
    """`0-1 x1 \\| 2-3 x1`: `pipebd plan`'s stages, its '|' escaped in a table cell; '-' without stages."""
    return stages_line(stages).replace("|", "\\|") if stages else "-"
