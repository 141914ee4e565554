"""A transformer search's trade-off curve on its job page: what each budget buys from the kept library.

One panel per cost the search measured (parameters, KV-cache bytes per token, latency where profiled): the
library's frontier (pipebd_core/workloads/library.py's `frontier`: for every budget on that cost alone, the
least summed held-out loss a choice reaches) as a step line, and every choice made from the library marked
on it: the search's own, and each one made again (choices/<n>/, `pipebd choose`), with its budget and its
held-out perplexity. Pure: documents in, SVG coordinates out; `templates/partials/tradeoff_chart.html`
draws them, as the sweep page's objective chart is drawn.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.web.objective_chart import scale
from pipebd_core.documents.architecture import Architecture
from pipebd_core.workloads.library import Library, frontier, library_of

WIDTH, HEIGHT = 420, 220  # each panel's view box
LEFT, RIGHT, TOP, BOTTOM = 56, 16, 12, 34  # room for the loss labels (left) and the cost labels (below)
AXES = {"params": "decoder-layer parameters", "kv_cache": "KV-cache bytes per token", "latency": "forward time"}


@dataclass(frozen=True)
class Choice:
    """A choice made from the library: its architecture.json and, once evaluated, its perplexity."""

    label: str  # "the search", "choice 2"
    architecture: Architecture
    perplexity: float | None


@dataclass(frozen=True)
class Mark:
    label: str
    budget: str  # "params 0.5, kv_cache 0.25"; "none" for the lowest loss
    fraction: float  # of the teacher's layers, on the panel's cost
    loss: float  # the chosen candidates' summed loss
    perplexity: float | None
    x: float
    y: float


@dataclass(frozen=True)
class TradeoffPanel:
    cost: str  # params, kv_cache, latency
    axis: str
    curve: list[tuple[float, float]]  # (fraction, least summed loss), cheapest first
    path: str  # the curve as an SVG step line
    marks: list[Mark]
    high_fraction: float  # the cost axis runs from 0 to this (the teacher's 1.0, or a dearer choice's)
    low: float  # the loss axis, bottom to top
    high: float
    width: int = WIDTH
    height: int = HEIGHT
    left: int = LEFT
    bottom: int = HEIGHT - BOTTOM


@dataclass(frozen=True)
class TradeoffChart:
    measure: str  # what a loss is (workload.search_loss's description)
    panels: list[TradeoffPanel]


def budget_text(budget: dict[str, float] | None) -> str:
    return "none" if not budget else ", ".join(f"{name} {value:g}" for name, value in budget.items())


def tradeoff_chart(search: Architecture, measure: str, choices: list[Choice]) -> TradeoffChart | None:
    """The chart of a search's library with its choices marked; None for an architecture without a library."""
    if not search.candidates:
        return None
    library = library_of(search, measure)
    panels = [panel(library, cost, choices) for cost in library.costs if library.teacher.get(cost)]
    return TradeoffChart(measure, panels)


def summed_loss(architecture: Architecture) -> float:
    return sum(block.loss or 0.0 for block in architecture.blocks)


def panel(library: Library, cost: str, choices: list[Choice]) -> TradeoffPanel:
    """One cost's curve, and every choice that reached a fraction of that cost, marked on it."""
    curve = frontier(library, cost)
    placed = [
        (choice, fraction, summed_loss(choice.architecture))
        for choice in choices
        if (fraction := (choice.architecture.reached or {}).get(cost)) is not None
    ]
    losses = [loss for _, loss in curve] + [loss for _, _, loss in placed]
    low, high = min(losses), max(losses)
    right = max([1.0, curve[-1][0], *(fraction for _, fraction, _ in placed)])

    def at(fraction: float, loss: float) -> tuple[float, float]:
        return scale(fraction, 0.0, right, LEFT, WIDTH - RIGHT), scale(loss, low, high, HEIGHT - BOTTOM, TOP)

    marks = [
        Mark(
            choice.label,
            budget_text(choice.architecture.budget),
            fraction,
            loss,
            choice.perplexity,
            *at(fraction, loss),
        )
        for choice, fraction, loss in placed
    ]
    path = step_path([at(fraction, loss) for fraction, loss in curve])
    return TradeoffPanel(cost, AXES[cost], curve, path, marks, right, low, high)


def step_path(points: list[tuple[float, float]]) -> str:
    """`M x0 y0 H x1 V y1 ...`: a budget between two points of the curve buys the cheaper one's loss, so the
    line stays level until the next point's cost, then drops to its loss."""
    path = [f"M {points[0][0]} {points[0][1]}"]
    for at, loss in points[1:]:
        path += [f"H {at}", f"V {loss}"]
    return " ".join(path)
