"""A sweep's objective over time, drawn on its page as an inline SVG: each ended child is a point at its
end (minutes since the sweep was submitted) and its objective value, and a step line follows the best value
so far. Pure: the sweep's view in, coordinates out; `templates/partials/objective_chart.html` draws them.
Children still running (a `samples_per_s` objective has values for them) are not on it until they end.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.services.sweeps import SweepView

WIDTH, HEIGHT = 640, 220  # the SVG's view box
LEFT, RIGHT, TOP, BOTTOM = 56, 16, 12, 34  # room for the value labels (left) and the time labels (below)


@dataclass(frozen=True)
class ChartPoint:
    job_id: int
    minutes: float  # since the sweep was submitted
    value: float
    x: float
    y: float
    leads: bool  # it was the best so far when it ended


@dataclass(frozen=True)
class ObjectiveChart:
    points: list[ChartPoint]  # in the order the children ended
    best_path: str  # the SVG path of the best value so far: a step line
    low: float  # the value axis, bottom to top
    high: float
    span_min: float  # the time axis: 0 to the last end, in minutes
    metric: str
    goal: str
    width: int = WIDTH
    height: int = HEIGHT
    left: int = LEFT
    bottom: int = HEIGHT - BOTTOM


def scale(value: float, low: float, high: float, start: float, end: float) -> float:
    """`value` in [low, high] mapped onto [start, end] (the middle when the range is empty)."""
    if high <= low:
        return round((start + end) / 2, 1)
    return round(start + (end - start) * (value - low) / (high - low), 1)


def objective_chart(view: SweepView) -> ObjectiveChart | None:
    """The chart of the sweep's ended children with an objective value; None when there is none to draw."""
    objective = view.objective
    if objective is None:
        return None
    ended = sorted(
        (job.finished_at, job.id, value)
        for job in view.children
        if job.id is not None and job.finished_at is not None and (value := view.values.get(job.id)) is not None
    )
    if not ended:
        return None
    start = view.sweep.created_at
    minutes = [max(0.0, (finished - start) / 60) for finished, _, _ in ended]
    values = [value for _, _, value in ended]
    low, high, span = min(values), max(values), max(minutes[-1], 1e-9)
    sign = 1.0 if objective.goal == "minimize" else -1.0
    points, best = [], None
    for (_, job_id, value), at in zip(ended, minutes, strict=True):
        leads = best is None or sign * value < sign * best
        best = value if leads else best
        x = scale(at, 0.0, span, LEFT, WIDTH - RIGHT)
        y = scale(value, low, high, HEIGHT - BOTTOM, TOP)
        points.append(ChartPoint(job_id, at, value, x, y, leads))
    return ObjectiveChart(points, best_path(points), low, high, span, objective.metric, objective.goal)


def best_path(points: list[ChartPoint]) -> str:
    """`M x0 y0 H x1 V y1 ...`: level at the best value until a child beats it, then down (or up) to it; on
    to the last end."""
    leaders = [point for point in points if point.leads]
    path = [f"M {leaders[0].x} {leaders[0].y}"]
    for point in leaders[1:]:
        path += [f"H {point.x}", f"V {point.y}"]
    if points[-1].x > leaders[-1].x:
        path.append(f"H {points[-1].x}")
    return " ".join(path)
