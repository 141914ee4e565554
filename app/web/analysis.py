"""Why a job runs as fast as it does: per-rank time shares from the ranks' phase times, the measured
throughput, and a sentence naming the bottleneck rank and why.

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

from app.web.templating import blocks as block_text
from app.web.templating import millis
from pipebd_core.documents.distill_plan import PlanDocument
from pipebd_core.documents.telemetry import DistillLine
from pipebd_core.rundir import STEP_PHASES

WORK = ("data", "teacher", "student", "optim")  # computation a faster device would shorten
WAITS = ("recv_wait", "barrier")  # time spent waiting for other ranks: not busy
BETWEEN = "between"  # time between a rank's tasks, outside every timed phase
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


@dataclass
class RankLoad:
    """How one rank spent its recent wall time."""

    rank: int
    blocks: list[int]
    tasks: int
    wall_s: float  # from the first task's start to the last task's end
    phase_s: dict[str, float]
    distilled: float  # samples through all blocks: rows x blocks trained / blocks in the model

    def share(self, phase: str) -> float:
        if phase == BETWEEN:
            return max(0.0, self.wall_s - sum(self.phase_s.values())) / self.wall_s
        return self.phase_s.get(phase, 0.0) / self.wall_s

    @property
    def work_share(self) -> float:
        return sum(self.share(phase) for phase in WORK)

    @property
    def busy_share(self) -> float:
        """Everything but waiting for other ranks and the gaps between tasks."""
        return max(0.0, 1.0 - sum(self.share(phase) for phase in (*WAITS, BETWEEN)))

    def shares(self) -> list[tuple[str, float]]:
        """(phase, share) in execution order, then the time between tasks; only non-zero ones."""
        items = [(phase, self.share(phase)) for phase in (*STEP_PHASES, BETWEEN)]
        return [(phase, share) for phase, share in items if share > 0.0005]

    def largest(self, phases: tuple[str, ...]) -> tuple[str, float]:
        return max(((phase, self.share(phase)) for phase in phases), key=lambda item: item[1])


def rank_load(rank: int, lines: list[DistillLine], num_blocks: int) -> RankLoad | None:
    """The load of one rank over its telemetry lines (oldest first); None without lines."""
    if not lines:
        return None
    phase_s = dict.fromkeys(STEP_PHASES, 0.0)
    trained: set[int] = set()
    distilled = 0.0
    for line in lines:
        for phase, seconds in line.phases.items():
            phase_s[phase] = phase_s.get(phase, 0.0) + seconds
        trained.update(line.blocks)
        distilled += (line.samples or 0) * len(line.blocks) / max(1, num_blocks)
    first_start = lines[0].time - sum(lines[0].phases.values())
    wall = max(lines[-1].time - first_start, sum(phase_s.values()), 1e-9)
    return RankLoad(rank, sorted(trained), len(lines), wall, phase_s, distilled)


def rank_loads(lines_by_rank: dict[int, list[DistillLine]], num_blocks: int) -> list[RankLoad]:
    loads = (rank_load(rank, lines, num_blocks) for rank, lines in sorted(lines_by_rank.items()))
    return [load for load in loads if load is not None]


def samples_per_s(loads: list[RankLoad]) -> float | None:
    """Samples distilled through every block per second, summed over the ranks' shares of the work."""
    if not loads:
        return None
    return sum(load.distilled / load.wall_s for load in loads)


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


def _other_rank(load: RankLoad) -> str:
    phase, share = load.largest(("recv_wait", "send", "barrier", "allreduce", BETWEEN))
    if share < NOTABLE_WAIT:
        return f"rank {load.rank} is busy too (works {100 * load.work_share:.0f}% of the time)"
    return f"rank {load.rank} {WAIT_WORDS[phase]} {100 * share:.0f}% of the time"


def _waits(others: list[RankLoad]) -> str:
    return "; ".join(_other_rank(load) for load in others)


def predicted_bottleneck(plan: PlanDocument | None) -> tuple[int, float] | None:
    """(stage, predicted step seconds) of the chosen plan, when the planner ranked it."""
    ranked = plan.predictions.ranked(plan.stage_triples()) if plan and plan.predictions else None
    if ranked is None or ranked.bottleneck_stage is None:
        return None
    return ranked.bottleneck_stage, ranked.step_s


def _prediction(plan: PlanDocument | None, loads: list[RankLoad], batch_size: int) -> str | None:
    measured = samples_per_s(loads)
    step_s = batch_size / measured if measured else None
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


def find_bottleneck(loads: list[RankLoad], plan: PlanDocument | None, batch_size: int, ended: bool = False) -> Finding:
    """Which rank holds the job up and why, in sentences a newcomer can act on."""
    if not loads:
        if ended:
            return Finding(None, "No telemetry: the job ended before its ranks reported a step.", [])
        return Finding(None, "No telemetry yet: the bottleneck is named once the ranks report their first steps.", [])
    top = max(loads, key=lambda load: (load.work_share, -load.rank))
    prediction = _prediction(plan, loads, batch_size)
    details = [prediction] if prediction else []
    if len(loads) == 1:
        headline = (
            f"One rank does all the work: rank {top.rank} works {100 * top.work_share:.0f}% of the time"
            f" ({_work_words(top)})."
        )
        return Finding(top.rank, headline, details)
    others = [load for load in loads if load.rank != top.rank]
    runner_up = max(load.work_share for load in others)
    if top.work_share - runner_up < BALANCED_WITHIN:
        low, high = round(100 * min(load.work_share for load in loads)), round(100 * top.work_share)
        spread = f"about {high}%" if low == high else f"{low}–{high}%"
        headline = (
            f"The ranks are evenly loaded (each works {spread} of the time);"
            f" rank {top.rank} ({where(top, plan)}) is only marginally the busiest."
        )
        return Finding(top.rank, headline, [f"Meanwhile {_waits(others)}.", *details], balanced=True)
    else:
        headline = (
            f"Rank {top.rank} ({where(top, plan)}) is the bottleneck: it works {100 * top.work_share:.0f}%"
            f" of the time ({_work_words(top)}), more than any other rank."
        )
    return Finding(top.rank, headline, [f"Meanwhile {_waits(others)}.", *details])


@dataclass
class JobSummary:
    """One row of the compare table."""

    samples_per_s: float | None  # measured over the ranks' recent tasks
    step_s: float | None
    peak_mem: int | None  # the largest peak over the ranks (CUDA max allocated, or RSS on CPU)
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


def summarize(
    lines_by_rank: dict[int, list[DistillLine]],
    num_blocks: int,
    batch_size: int,
    final_loss: dict[str, float] | None,
) -> JobSummary:
    loads = rank_loads(lines_by_rank, num_blocks)
    speed = samples_per_s(loads)
    memory = [line.peak_mem for lines in lines_by_rank.values() for line in lines]
    return JobSummary(
        samples_per_s=speed,
        step_s=batch_size / speed if speed else None,
        peak_mem=max(memory) if memory else None,
        final_loss=final_loss or latest_losses(lines_by_rank),
    )
