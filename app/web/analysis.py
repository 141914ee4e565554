"""Why a job runs as fast as it does: per-rank time shares from the ranks' phase times (pipebd_core/figures.py's
RankLoad), and a sentence naming the bottleneck rank and why, quoting the job's figures (app/core/figures.py).

Each telemetry line is one task of one rank; it ends at `time`, and its phases (in execution order:
data or recv_wait, teacher, send, student, allreduce, barrier, optim) sum to the task's duration.
Over a rank's recent lines its wall time splits into work (data, teacher, student, optim),
communication (send, allreduce), waiting (recv_wait, barrier) and the gaps between tasks. The rank
with the largest share of work is the bottleneck: the others wait for it, downstream ranks in
`recv_wait`, upstream ones in `send` (their activations back up), all of them where ranks meet
(`allreduce`, `barrier`).
"""

from __future__ import annotations

from dataclasses import dataclass

from app.core.figures import step_of
from app.core.tables import Job
from app.web.templating import blocks as block_text
from app.web.templating import millis
from pipebd_core.documents.distill_plan import PlanDocument
from pipebd_core.documents.telemetry import DistillLine
from pipebd_core.figures import BETWEEN, RankLoad, spread

WORK = ("data", "teacher", "student", "optim")  # computation a faster device would shorten
LABELS = {
    "data": "loading data",
    "recv_wait": "waiting for input",
    "recv": "receiving",
    "teacher": "teacher work",
    "send": "sending",
    "student": "student work",
    "allreduce": "all-reduce",
    "barrier": "barrier",
    "optim": "optimiser step",
    BETWEEN: "between tasks",
}
WAIT_WORDS = {
    "recv_wait": "waits for its input (recv_wait)",
    "send": "is held up sending its output on (send)",
    "barrier": "waits at the barrier for the other ranks (barrier)",
    "allreduce": "waits in the all-reduce for the ranks it shares gradients with",
    BETWEEN: "is idle between tasks",
}
BALANCED_WITHIN = 0.05  # work shares closer than this: no single rank holds the others up
NOTABLE_WAIT = 0.05  # waits below this share are not worth a sentence


def work_share(load: RankLoad) -> float:
    """The share of a rank's wall time spent computing (what names the bottleneck)."""
    return sum(load.share(phase) for phase in WORK)


@dataclass
class Finding:
    rank: int | None  # the bottleneck rank (or the busiest of evenly loaded ranks); None without telemetry
    headline: str
    details: list[str]
    balanced: bool = False  # no rank stands out: `rank` is only the busiest


def where(load: RankLoad, plan: PlanDocument | None) -> str:
    """`stage 1, blocks 1–2` (or `blocks 0–3` outside pipeline modes), with `a replica` when replicated."""
    info = plan.rank(load.rank) if plan else None
    if info is None:
        return f"blocks {block_text(load.blocks)}"
    text = f"blocks {block_text(info.blocks)}"
    if info.stage is not None:
        text = f"stage {info.stage}, {text}"
    if info.role == "replica":
        text += ", one of its replicas"
    return text


def _work_words(load: RankLoad) -> str:
    parts = sorted(((phase, load.share(phase)) for phase in WORK), key=lambda item: -item[1])[:2]
    named = [f"{LABELS[phase]} {100 * share:.0f}%" for phase, share in parts if share >= 0.01]
    return ", ".join(named) or "short tasks"


def _busy(load: RankLoad) -> str:
    """`busy 77% of the time, computing 53%`: the busy share (the table's Busy column) and the work in it."""
    return f"busy {100 * load.busy_share:.0f}% of the time, computing {100 * work_share(load):.0f}%"


def _other_rank(load: RankLoad) -> str:
    phase, share = load.largest(("recv_wait", "send", "barrier", "allreduce", BETWEEN))
    if share < NOTABLE_WAIT:
        return f"rank {load.rank} is busy too ({_busy(load)})"
    return f"rank {load.rank} {WAIT_WORDS[phase]} {100 * share:.0f}% of the time"


def _waits(others: list[RankLoad]) -> str:
    return "; ".join(_other_rank(load) for load in others)


def predicted_bottleneck(plan: PlanDocument | None) -> tuple[int, float] | None:
    """(stage, predicted step seconds) of the chosen plan, when the planner ranked it."""
    ranked = plan.predictions.ranked(plan.stage_triples()) if plan and plan.predictions else None
    if ranked is None or ranked.bottleneck_stage is None:
        return None
    return ranked.bottleneck_stage, ranked.step_s


def _prediction(plan: PlanDocument | None, step_s: float | None) -> str | None:
    predicted = predicted_bottleneck(plan)
    if predicted is not None:
        stage, predicted_s = predicted
        return (
            f"The planner predicted stage {stage} as the bottleneck at {millis(predicted_s)} per step;"
            f" measured: {millis(step_s)} per step."
        )
    planned_s = plan.details.predicted_step_s if plan else None
    if planned_s:
        return f"Predicted {millis(planned_s)} per step; measured: {millis(step_s)} per step."
    if step_s is not None:
        return f"Measured: {millis(step_s)} per step (no prediction: the job was not profiled)."
    return None


def find_bottleneck(
    loads: list[RankLoad], plan: PlanDocument | None, step_s: float | None, ended: bool = False
) -> Finding:
    """Which rank holds the job up and why, in sentences a newcomer can act on; `step_s`: the job's measured
    step (app/core/figures.py), quoted beside the prediction."""
    if not loads:
        if ended:
            return Finding(None, "No telemetry: the job ended before its ranks reported a step.", [])
        return Finding(None, "No telemetry yet: the bottleneck is named once the ranks report their first steps.", [])
    top = max(loads, key=lambda load: (work_share(load), -load.rank))
    prediction = _prediction(plan, step_s)
    details = [prediction] if prediction else []
    if len(loads) == 1:
        headline = f"One rank does all the work: rank {top.rank} is {_busy(top)} ({_work_words(top)})."
        return Finding(top.rank, headline, details)
    others = [load for load in loads if load.rank != top.rank]
    runner_up = max(work_share(load) for load in others)
    if work_share(top) - runner_up < BALANCED_WITHIN:
        low, high = round(100 * min(work_share(load) for load in loads)), round(100 * work_share(top))
        band = f"about {high}%" if low == high else f"{low}–{high}%"
        headline = (
            f"The ranks are evenly loaded (each computes {band} of the time);"
            f" rank {top.rank} ({where(top, plan)}) is only marginally the busiest."
        )
        return Finding(top.rank, headline, [f"Meanwhile {_waits(others)}.", *details], balanced=True)
    else:
        headline = (
            f"Rank {top.rank} ({where(top, plan)}) is the bottleneck: it is {_busy(top)} ({_work_words(top)}),"
            " more computing than any other rank."
        )
    return Finding(top.rank, headline, [f"Meanwhile {_waits(others)}.", *details])


@dataclass
class JobSummary:
    """One row of the compare table: the job's figures (app/core/figures.py) and its final losses."""

    samples_per_s: float | None
    step_s: float | None
    busy_share: float | None
    peak_mem: int | None  # the largest peak over the ranks (CUDA max allocated, or RSS on CPU)
    spread: float | None  # how much its steps' pace varies (pipebd_core.figures.spread)
    final_loss: dict[str, float]


def latest_losses(lines_by_rank: dict[int, list[DistillLine]]) -> dict[str, float]:
    """Each block's loss at the latest step it was reported, averaged over the ranks reporting it."""
    latest: dict[int, tuple[float, list[float]]] = {}
    for lines in lines_by_rank.values():
        for line in lines:
            if line.round != "weights":
                continue
            for block, value in line.loss.items():
                when, values = latest.get(block, (-1.0, []))
                if line.step > when:
                    latest[block] = (line.step, [value])
                elif line.step == when:
                    values.append(value)
    return {str(block): sum(values) / len(values) for block, (_, values) in sorted(latest.items())}


def summarize(job: Job, lines_by_rank: dict[int, list[DistillLine]], final_loss: dict[str, float] | None) -> JobSummary:
    """The compare row of `job`: the figures stored on its row, the spread of its recent lines."""
    return JobSummary(
        samples_per_s=job.samples_per_s,
        step_s=step_of(job),
        busy_share=job.busy_share,
        peak_mem=job.peak_mem,
        spread=spread(lines_by_rank),
        final_loss=final_loss or latest_losses(lines_by_rank),
    )
