"""The sweep page's objective-over-time chart: each ended child with a value at its end, in end order, the
leaders marked, and the step line of the best so far (app/web/objective_chart.py)."""

from __future__ import annotations

from app.core.objectives import best_of
from app.core.tables import Job, Sweep
from app.services.sweeps import SweepView, progress_of
from app.web.objective_chart import BOTTOM, HEIGHT, LEFT, RIGHT, TOP, WIDTH, objective_chart


def view(goal: str, ended: list[tuple[float | None, float | None]]) -> SweepView:
    """A sweep submitted at t=0 whose child i ended at `ended[i][0]` s (None: still running) with value
    `ended[i][1]` (None: none)."""
    objective = {"metric": "final_loss", "goal": goal}
    sweep = Sweep(id=1, name="s", spec={}, search={}, objective=objective, created_at=0.0)
    children = [
        Job(id=10 + i, name="c", state="running" if at is None else "succeeded", nproc=1, queue="q", spec={})
        for i, (at, _) in enumerate(ended)
    ]
    for child, (at, _) in zip(children, ended, strict=True):
        child.finished_at = at
    found = SweepView(sweep, children, "running", progress_of(children))
    found.values = {10 + i: value for i, (_, value) in enumerate(ended)}
    assert found.objective is not None
    found.best = best_of(found.values, found.objective)
    return found


def test_each_ended_child_is_a_point_in_end_order_under_the_step_line_of_the_best() -> None:
    # ended at 3, 1, 2 minutes; a child ended without a value; one still running with a value
    chart = objective_chart(view("minimize", [(180.0, 0.2), (60.0, 0.5), (120.0, 0.7), (90.0, None), (None, 0.1)]))
    assert chart is not None
    assert [(p.job_id, p.minutes, p.value, p.leads) for p in chart.points] == [
        (11, 1.0, 0.5, True),
        (12, 2.0, 0.7, False),
        (10, 3.0, 0.2, True),
    ]
    assert (chart.low, chart.high, chart.span_min) == (0.2, 0.7, 3.0)
    x = [round(LEFT + (WIDTH - RIGHT - LEFT) * m / 3.0, 1) for m in (1.0, 2.0, 3.0)]
    y = [round(HEIGHT - BOTTOM + (TOP - HEIGHT + BOTTOM) * (v - 0.2) / 0.5, 1) for v in (0.5, 0.7, 0.2)]
    assert [(p.x, p.y) for p in chart.points] == list(zip(x, y, strict=True))
    assert y[2] == HEIGHT - BOTTOM and y[1] == TOP  # the lowest value at the bottom, the highest at the top
    assert chart.best_path == f"M {x[0]} {y[0]} H {x[2]} V {y[2]}"


def test_a_maximised_objective_leads_upward_and_the_line_runs_on_to_the_last_end() -> None:
    chart = objective_chart(view("maximize", [(60.0, 0.6), (120.0, 0.8), (180.0, 0.7)]))
    assert chart is not None and [p.leads for p in chart.points] == [True, True, False]
    first, second, last = chart.points
    assert chart.best_path == f"M {first.x} {first.y} H {second.x} V {second.y} H {last.x}"


def test_there_is_no_chart_without_an_objective_or_an_ended_value_and_one_point_sits_in_the_middle() -> None:
    assert objective_chart(view("minimize", [(None, 0.3), (60.0, None)])) is None
    no_objective = view("minimize", [(60.0, 0.3)])
    no_objective.sweep.objective = None
    assert objective_chart(no_objective) is None
    alone = objective_chart(view("minimize", [(0.0, 0.3)]))
    assert alone is not None and alone.points[0].y == (TOP + HEIGHT - BOTTOM) / 2 and alone.points[0].leads
