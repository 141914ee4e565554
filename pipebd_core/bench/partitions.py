"""The partitions table: every partitioner's cut for each pipelined strategy, predicted and measured.

An end-to-end training accuracy record (`pipebd bench SPEC --phase finetune --accuracy`) runs every
pipelined strategy (gpipe, 1f1b, zb) on the cut of every partitioner (even, pipedream, layerpipe and the
planner's own, auto: the fastest predicted of the others); a cut two partitioners share ran once, and its
plan lists both (`PlanAccuracy.partitioners`). For each strategy the table gives every partitioner's
cut, its predicted and measured step (the median of its repeats, with their lowest and highest) and how
much slower it measured than the best measured cut of that strategy; then the planner's pick (auto's
cut) against the best measured: its regret over the repeats (doubt.figure_doubt), inside the noise when
the two cuts' intervals overlap, against the target of PICK_TARGET. Where the pick misses, the line says
by how much and what the measurements show: what each of the two cuts was predicted and measured, so a
reader sees which prediction was off and in which direction.
"""

from __future__ import annotations

from pipebd_core.bench.doubt import figure_doubt
from pipebd_core.documents.bench_record import Arm, BenchRecord, PlanAccuracy
from pipebd_core.documents.distill_plan import stages_line
from pipebd_core.finetune.plan import PIPELINED

PARTITIONERS = ("even", "pipedream", "layerpipe", "auto")  # table order; auto: the planner's own
PLANNER = "auto"
PICK_TARGET = 0.03  # the planner's cut within 3% of the best measured one (or within the noise)


def has_partitions(record: BenchRecord) -> bool:
    """Whether `record` holds cuts by partitioner (a finetune accuracy record since the partitions table)."""
    return record.accuracy is not None and any(plan.partitioners for plan in record.accuracy.plans)


def cuts_of(plans: list[PlanAccuracy], strategy: str) -> dict[str, PlanAccuracy]:
    """`strategy`'s plan for each partitioner that cut it, in table order."""
    found = {p: plan for plan in plans if plan.mode == strategy for p in plan.partitioners}
    return {partitioner: found[partitioner] for partitioner in PARTITIONERS if partitioner in found}


def cut_text(plan: PlanAccuracy) -> str:
    """`0-2 \\| 3-8`, with LayerPipe's moved channels per boundary where any moved."""
    stages = stages_line(plan.stages).replace(" x1", "").replace("|", "\\|")
    return stages + (f" (moved {', '.join(str(c) for c in plan.moved)})" if any(plan.moved) else "")


def measured_text(arm: Arm) -> str:
    low, high = arm.interval
    return f"{arm.step_s:.4g} [{low:.4g}, {high:.4g}]"


def partition_rows(strategy: str, cuts: dict[str, PlanAccuracy], arms: dict[str, Arm]) -> list[str]:
    best = min(arms[plan.arm].step_s for plan in cuts.values())
    rows = []
    for partitioner, plan in cuts.items():
        arm = arms[plan.arm]
        error = (plan.predicted_step_s - arm.step_s) / arm.step_s
        slower = arm.step_s / best - 1
        cells = [strategy, partitioner, cut_text(plan), plan.arm, f"{plan.predicted_step_s:.4g}"]
        cells += [measured_text(arm), f"{error:+.0%}", "best" if slower == 0 else f"+{slower:.1%}"]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def pick_line(strategy: str, cuts: dict[str, PlanAccuracy], arms: dict[str, Arm]) -> str | None:
    """The planner's cut against the best measured one for `strategy`, with the cause where it misses."""
    pick = cuts.get(PLANNER)
    if pick is None:
        return None
    by_arm = {plan.arm: plan for plan in cuts.values()}
    doubt = figure_doubt({arm: plan.predicted_step_s for arm, plan in by_arm.items()}, arms, pick.arm)
    best = by_arm[min(by_arm, key=lambda arm: arms[arm].step_s)]
    same = [p for p in pick.partitioners if p != PLANNER]
    head = f"{strategy}: the planner's cut ({PLANNER}, {' = '.join(same) or 'its own'}'s)"
    if doubt.chosen_fastest or doubt.regret is None:
        return f"{head} is the best measured."
    regret = doubt.regret.text("{:.1%}".format)
    names = " = ".join(p for p in best.partitioners if p != PLANNER)
    versus = f"{regret} slower than the best measured ({names}'s)"
    if doubt.regret_in_noise:
        return f"{head} measured {versus}, inside the noise (their intervals overlap)."
    if doubt.regret.value <= PICK_TARGET:
        return f"{head} measured {versus}, within the {PICK_TARGET:.0%} target."
    over = doubt.regret.value - PICK_TARGET
    return f"{head} measured {versus}: {over:.1%} over the {PICK_TARGET:.0%} target. {cause(pick, best, arms)}"


def cause(pick: PlanAccuracy, best: PlanAccuracy, arms: dict[str, Arm]) -> str:
    """What the measurements show of a missed pick: each cut predicted against measured."""
    p_pick, p_best = pick.predicted_step_s, best.predicted_step_s
    m_pick, m_best = arms[pick.arm].step_s, arms[best.arm].step_s
    order = "ahead of" if p_pick < p_best else "level with" if p_pick == p_best else "behind"
    return (
        f"The profile predicted the pick {p_pick:.4g} s and the best {p_best:.4g} s (the pick {order} it);"
        f" measured {m_pick:.4g} s and {m_best:.4g} s: the pick's prediction is {(p_pick - m_pick) / m_pick:+.0%}"
        f" off, the best's {(p_best - m_best) / m_best:+.0%}."
    )


def partitions_lines(record: BenchRecord) -> list[str]:
    """The record's partitions table and, per strategy, the planner's pick against the best measured cut."""
    if record.accuracy is None or not has_partitions(record):
        return []
    arms = {arm.name: arm for arm in record.arms}
    head = ["strategy", "partitioner", "cut", "arm", "predicted s/step", "measured s/step [runs]", "error"]
    head += ["vs best cut"]
    lines = ["#### Partitions", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    picks = []
    for strategy in PIPELINED:
        cuts = cuts_of(record.accuracy.plans, strategy)
        if cuts:
            lines += partition_rows(strategy, cuts, arms)
            picks.append(pick_line(strategy, cuts, arms))
    lines += [""] + [f"- {line}" for line in picks if line is not None] + [""]
    return lines
