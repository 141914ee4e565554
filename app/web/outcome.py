"""The job page's outcome part: what a distillation produced, once finalize has run.

The distilled (or searched) network's quality beside its teacher's, from summary.json: held-out perplexity
for a language model (and, once a finetune phase has run, the fine-tuned model's beside it), top-1 where
the data set has real labels; a language model's parameters and KV-cache bytes per token, after
distillation beside its teacher's (before). For a transformer search, from
architecture.json: every layer's candidates with their held-out loss, parameters and KV-cache bytes per token,
the chosen one marked, how it was chosen, and each cost the choice reached (a fraction of the teacher's
layers') against its budget where one was set, and the library's trade-off curve with every choice made
from it marked (app/web/tradeoff_chart.py). A NAS search's choice is the architecture part's
(app/web/architecture.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from app.core.summaries import read_summary
from app.core.tables import Job
from app.web import queries
from app.web.tradeoff_chart import Choice, TradeoffChart, tradeoff_chart
from pipebd_core.documents.architecture import Architecture, CandidateResult
from pipebd_core.documents.base import DocumentError
from pipebd_core.documents.summary import Summary
from pipebd_core.spec import WorkloadSpec
from pipebd_core.workloads.library import MEASURES


@dataclass(frozen=True)
class Quality:
    """One measure of the distilled network against its teacher's; lower or higher is better by `lower_wins`."""

    what: str  # "Held-out perplexity", "Top-1"
    student: float | None
    teacher: float | None
    lower_wins: bool
    finetuned: bool = False  # measured after end-to-end training (the finetune phase), else after distillation


@dataclass(frozen=True)
class LayerChoice:
    """One layer of a transformer search: its candidates in the table's column order (None: not offered)."""

    block: int
    cells: list[CandidateResult | None]
    chosen: str


COST_UNITS = {"params": "parameters", "kv_cache": "KV-cache bytes per token", "latency": "ms forward, as profiled"}


@dataclass(frozen=True)
class Cost:
    """One cost of the chosen network: what it reached against the teacher's, and its budget if one was set."""

    name: str  # a workload.budget field: params, kv_cache, latency
    unit: str
    chosen: float
    teacher: float
    reached: float  # chosen / teacher
    budget: float | None

    def shown(self, value: float) -> str:
        """A total as the page prints it: milliseconds for latency (seconds in architecture.json), else a count."""
        return f"{value * 1e3:,.2f}" if self.name == "latency" else f"{int(value):,}"


@dataclass(frozen=True)
class Size:
    """A language model's size after distillation beside its teacher's (before): parameters, or KV-cache
    bytes per token."""

    what: str  # "Parameters", "KV cache per token"
    unit: str  # "", " B"
    student: int
    teacher: int | None

    @property
    def reached(self) -> float | None:
        """The distilled network's share of the teacher's."""
        return self.student / self.teacher if self.teacher else None


def sizes_of(summary: Summary) -> list[Size]:
    """The sizes summary.json has (a language model's finalize measures them), distilled beside teacher."""
    sizes = []
    if summary.student_params is not None:
        sizes.append(Size("Parameters", "", summary.student_params, summary.teacher_params))
    if summary.student_kv_cache_bytes is not None:
        sizes.append(Size("KV cache per token", " B", summary.student_kv_cache_bytes, summary.teacher_kv_cache_bytes))
    return sizes


@dataclass
class OutcomeView:
    quality: list[Quality] = field(default_factory=list)
    sizes: list[Size] = field(default_factory=list)  # a language model's, beside its perplexity
    names: list[str] = field(default_factory=list)  # the candidates, in the order of workload.replacements
    layers: list[LayerChoice] = field(default_factory=list)
    chosen_by: str | None = None
    costs: list[Cost] = field(default_factory=list)
    budgeted: bool = False
    error: str | None = None  # why architecture.json cannot be shown
    tradeoff: TradeoffChart | None = None  # a transformer search: its library's curve, every choice marked

    @property
    def shown(self) -> bool:
        return bool(self.quality or self.sizes or self.layers or self.error)


def quality_of(summary: Summary) -> list[Quality]:
    """The quality figures the summary has: perplexity for a language model, else top-1 where measured; each
    after distillation and, where the finetune phase ran, after it."""
    tuned = summary.finetune
    if summary.student_perplexity is not None:
        what, lower, student, teacher = (
            "Held-out perplexity",
            True,
            summary.student_perplexity,
            summary.teacher_perplexity,
        )
        after = (tuned.perplexity_after, tuned.teacher_perplexity) if tuned is not None else (None, None)
    elif summary.student_top1 is not None:
        what, lower = "Top-1", False
        student, teacher = summary.student_top1, summary.teacher_top1
        after = (tuned.top1_after, tuned.teacher_top1) if tuned is not None else (None, None)
    else:
        return []
    qualities = [Quality(what, student, teacher, lower)]
    if after[0] is not None:
        qualities.append(Quality(what, after[0], after[1], lower, finetuned=True))
    return qualities


def layer_choices(architecture: Architecture) -> tuple[list[str], list[LayerChoice]]:
    """The candidate names (first seen first) and, per block, its candidates in that order and its choice."""
    candidates = architecture.candidates or []
    names = list(dict.fromkeys(candidate.name for candidate in candidates))
    layers = []
    for block in architecture.blocks:
        offered = {c.name: c for c in candidates if c.block == block.block}
        layers.append(LayerChoice(block.block, [offered.get(name) for name in names], block.layers[0]))
    return names, layers


def outcome_view(job: Job) -> OutcomeView:
    summary = read_summary(job)
    view = OutcomeView(
        quality=quality_of(summary) if summary is not None else [], sizes=sizes_of(summary) if summary else []
    )
    try:
        architecture = queries.read_document(job, "architecture.json", Architecture)
    except DocumentError as error:
        view.error = str(error)
        return view
    if architecture is None or architecture.candidates is None:  # not written yet, or a NAS search's
        return view
    view.names, view.layers = layer_choices(architecture)
    view.chosen_by, view.costs = architecture.chosen_by, costs_of(architecture)
    view.budgeted = bool(architecture.budget)
    view.tradeoff = tradeoff_of(job, architecture, summary)
    return view


def tradeoff_of(job: Job, architecture: Architecture, summary: Summary | None) -> TradeoffChart | None:
    """The search's library curve with its own choice and every choice made again from it marked."""
    measure = MEASURES[WorkloadSpec.model_validate(job.spec.get("workload", {})).search_loss]
    own = Choice("the search", architecture, summary.student_perplexity if summary is not None else None)
    again = [Choice(f"choice {r.index}", found, r.perplexity) for r, found in queries.read_choices(job)]
    return tradeoff_chart(architecture, measure, [own, *again])


def costs_of(architecture: Architecture) -> list[Cost]:
    """Each cost architecture.json reports, in the order it reached them."""
    budget, blocks = architecture.budget or {}, architecture.blocks
    totals: dict[str, tuple[float, float | None]] = {
        "params": (sum(block.params or 0 for block in blocks), architecture.teacher_params),
        "kv_cache": (sum(block.kv_cache_bytes or 0 for block in blocks), architecture.teacher_kv_cache_bytes),
        "latency": (sum(block.latency_s or 0.0 for block in blocks), architecture.teacher_latency_s),
    }
    return [
        Cost(name, COST_UNITS[name], totals[name][0], totals[name][1] or 0, fraction, budget.get(name))
        for name, fraction in (architecture.reached or {}).items()
        if name in totals and totals[name][1] is not None
    ]
