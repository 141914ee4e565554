"""The accuracy tables of the benchmarks page: one a phase, a row per accuracy record.

`<!-- pipebd bench --accuracy FILE... -->` on docs/benchmarks.md (page.py) opens them: for each phase
(distillation, end-to-end training) one table, a row per record of `pipebd bench --accuracy`: the
network, its ranks and plans, the noise floor and the MAPE target it sets, then from the profile alone
MAPE, Kendall's tau and the chosen plan's regret, each with its interval over the repeats (doubt.py),
the calibrated MAPE, and whether the network is in the development set. The cost models were developed
against DEVELOPMENT (the networks their fixes were measured on); every other network is held-out: judged
on, never changed for.
"""

from __future__ import annotations

from pipebd_core.bench.doubt import Interval, figure_doubt, guarded_predictions, noise_floor, target
from pipebd_core.bench.misses import TAU_TARGET
from pipebd_core.documents.bench_record import BenchRecord

DEVELOPMENT = ("layerpipe-sample", "vgg16-dsconv-demo")  # by spec name: the cost models' development set
PHASES = {"distill": "Distillation", "finetune": "End-to-end training"}


def percent(value: float) -> str:
    return f"{value:.1%}"


def ranged(interval: Interval | None, form: str) -> str:
    """`6.8% [5.9%, 7.9%]`: the median and its range over the repeats (the count is the row's repeats)."""
    if interval is None:
        return "-"
    return f"{form.format(interval.value)} [{form.format(interval.low)}, {form.format(interval.high)}]"


def regret_cell(record: BenchRecord) -> str:
    assert record.accuracy is not None
    arms = {arm.name: arm for arm in record.arms}
    plans = record.accuracy.plans
    doubt = figure_doubt({plan.arm: plan.predicted_step_s for plan in plans}, arms, record.accuracy.chosen)
    said = " (the fastest)" if doubt.chosen_fastest else " (in the noise)" if doubt.regret_in_noise else ""
    return ranged(doubt.regret, "{:.1%}") + said


def accuracy_row(path: str, record: BenchRecord) -> str:
    """One record's row: network, ranks, plans, repeats, floor, target, MAPE, tau, regret, calibrated MAPE, set."""
    assert record.accuracy is not None
    arms = {arm.name: arm for arm in record.arms}
    plans = record.accuracy.plans
    floor = noise_floor([arms[plan.arm] for plan in plans])
    alone = figure_doubt({plan.arm: plan.predicted_step_s for plan in plans}, arms, record.accuracy.chosen)
    calibrated_s = guarded_predictions(plans)
    calibrated = None
    if calibrated_s and record.accuracy.calibrated is not None:
        calibrated = figure_doubt(calibrated_s, arms, record.accuracy.calibrated.chosen).mape
    cells = [
        record.name,
        str(record.nproc),
        str(len(plans)),
        str(record.repeats),
        percent(floor) if floor is not None else "-",
        percent(target(floor)),
        ranged(alone.mape, "{:.1%}"),
        ranged(alone.rank_correlation, "{:.2f}"),
        regret_cell(record),
        ranged(calibrated, "{:.1%}"),
        "development" if record.name in DEVELOPMENT else "held-out",
        f"`{path.rsplit('/', 1)[-1]}`",
    ]
    return "| " + " | ".join(cells) + " |"


def accuracy_tables(records: list[tuple[str, BenchRecord]]) -> str:
    """One markdown table a phase over the accuracy records given (path, record), in the order given."""
    head = ["network", "ranks", "plans", "repeats", "noise floor", "MAPE target", "MAPE", "tau", "regret"]
    head += ["calibrated MAPE", "set", "record"]
    parts = []
    for phase, title in PHASES.items():
        rows = [accuracy_row(path, r) for path, r in records if r.phase == phase and r.accuracy is not None]
        if not rows:
            continue
        parts += [
            f"**{title}** (Kendall's tau target {TAU_TARGET[phase]:.1f}; figures from the profile alone, median"
            " [lowest, highest] over the repeats):",
            "",
            "| " + " | ".join(head) + " |",
            "|" + "---|" * len(head),
            *rows,
            "",
        ]
    return "\n".join(parts)
