"""The benchmarks page's tables, rendered from benchmark records (`pipebd bench --report FILE...`).

Pure and deterministic: the same records give the same markdown, byte for byte, so the page can be
regenerated and compared. Every figure carries its repeats: an arm's step is the median of its runs,
listed beside it with their spread ((highest - lowest) / median); its interval is its lowest to its
highest run. A comparison with the baseline (dp; ddp or pipedream for end-to-end training) whose
intervals overlap says so instead of giving a ratio, and so does the line naming the fastest arm. An
arm with a run measured while other processes used more than the record's `shared_cores` is marked
shared in its row. End-to-end training's tables add each rank's bubble. A record of `pipebd bench
--accuracy` adds its accuracy table: every candidate plan's prediction from the profile alone and
calibrated on another run, against what it measured, and the figures over them (MAPE, Kendall's tau,
the chosen plan's regret).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from pipebd_core.documents.bench_record import Accuracy, AccuracyFigures, Arm, ArmRun, BenchRecord, PlanAccuracy
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
    if record.split_cost is not None:
        lines += [f"Split backward, (I + W) / B over the layers: {record.split_cost:.2f}.", ""]
    if record.accuracy is not None:
        lines += accuracy_lines(record.accuracy)
    return "\n".join(lines)


def accuracy_lines(accuracy: Accuracy) -> list[str]:
    """The accuracy table: each candidate's predictions against its measured step, then the figures."""
    head = ["plan", "from", "stages", "measured s/step", "predicted", "error", "calibrated", "error", "calibrated on"]
    lines = ["#### Predictions checked", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += [accuracy_row(plan) for plan in accuracy.plans]
    alone = AccuracyFigures(
        mape=accuracy.mape,
        rank_correlation=accuracy.rank_correlation,
        chosen=accuracy.chosen,
        chosen_regret=accuracy.chosen_regret,
    )
    lines += ["", "From the profile alone: " + figures_text(alone, "the planner's first plan") + "."]
    if accuracy.calibrated is None:
        lines += ["", "Calibrated: no run wrote a calibration.", ""]
        return lines
    rule = f"{accuracy.rule}; seed {accuracy.seed}"
    calibrated = figures_text(accuracy.calibrated, "the lowest calibrated prediction")
    return [*lines, "", f"Calibrated out of sample ({rule}): {calibrated}.", ""]


def accuracy_row(plan: PlanAccuracy) -> str:
    names = " = ".join([plan.arm, *plan.also])
    calibrated = plan.calibrated_step_s
    cells = [names, plan.source, stages_text(plan.stages), seconds(plan.measured_step_s)]
    cells += [seconds(plan.predicted_step_s), error(plan.predicted_step_s, plan.measured_step_s)]
    cells += [seconds(calibrated), error(calibrated, plan.measured_step_s)] if calibrated is not None else ["-", "-"]
    cells.append(plan.calibrated_from or "-")
    return "| " + " | ".join(cells) + " |"


def error(predicted: float, measured: float) -> str:
    return f"{(predicted - measured) / measured:+.0%}"


def figures_text(figures: AccuracyFigures, how: str) -> str:
    """MAPE, Kendall's tau and the chosen plan's regret, in words."""
    tau = "-" if figures.rank_correlation is None else f"{figures.rank_correlation:.2f}"
    return (
        f"MAPE {figures.mape:.1%}, Kendall's tau {tau}, chosen plan {figures.chosen} ({how})"
        f" {figures.chosen_regret:.1%} slower than the fastest measured"
    )


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
        f"Commit `{record.commit or 'unknown'}`; {machine.cores} x {machine.cpu_model}, {gpus},"
        f" {machine.memory_bytes / 2**30:.0f} GiB, Python {machine.python}, torch {machine.torch}."
        f" Batch {record.batch_size}, {record.steps} steps a run ({timing.warmup_steps} warm-up, then"
        f" {timed}, every arm alike), {repeats}; every arm planned from profile"
        f" `{record.profile_hash}`. {shared_line(record)}"
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
        f"{record.bound.ideal_s / arm.step_s:.0%}",
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
    """Speed against the baseline (its step over this one's), unless their intervals overlap."""
    if baseline is None:
        return "-"
    if arm is not baseline and overlap(arm, baseline):
        return f"overlaps {baseline.name}"
    return f"{baseline.step_s / arm.step_s:.2f}x"


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
