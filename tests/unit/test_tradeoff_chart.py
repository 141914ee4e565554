"""tier: pure logic, CPU

A search library's trade-off curve (pipebd_core/workloads/library.py's `frontier`) and the job page's chart of it
(app/web/tradeoff_chart.py, templates/partials/tradeoff_chart.html): the curve is what a budget on one cost buys,
checked against every choice of one candidate per layer and against the choice the budget's mixed-integer program
makes; every choice made from the library is marked where its cost and summed loss put it.
"""

from __future__ import annotations

import itertools
import random
import re

import pytest

from app.web.outcome import OutcomeView, costs_of, layer_choices
from app.web.templating import templates
from app.web.tradeoff_chart import BOTTOM, HEIGHT, LEFT, RIGHT, TOP, WIDTH, Choice, tradeoff_chart
from pipebd_core.documents.architecture import Architecture, ArchitectureBlock, CandidateResult
from pipebd_core.spec import Budget, SpecError
from pipebd_core.workloads.library import Library, choose_from, chosen_architecture, frontier

NAMES = ["keep", "ffn_1/2", "kv_1", "noop"]


def drawn_library(seed: int, layers: int = 3) -> Library:
    """Candidates of random losses and costs (keep: the teacher layer, loss 0, full costs)."""
    draw = random.Random(seed)
    losses = [[0.0] + [round(draw.uniform(0.05, 2.0), 3) for _ in NAMES[1:]] for _ in range(layers)]
    params = [[100.0] + [float(draw.randint(0, 90)) for _ in NAMES[1:]] for _ in range(layers)]
    kv = [[64.0, 64.0, 32.0, 0.0] for _ in range(layers)]
    teacher = {"params": 100.0 * layers, "kv_cache": 64.0 * layers}
    return Library([NAMES] * layers, losses, {"params": params, "kv_cache": kv}, teacher, "held-out loss")


def every_choice(library: Library, cost: str) -> list[tuple[float, float]]:
    """(cost as a fraction of the teacher's, summed loss) of every choice of one candidate per layer."""
    found = []
    for picks in itertools.product(*(range(len(layer)) for layer in library.names)):
        summed = sum(library.costs[cost][i][p] for i, p in enumerate(picks))
        found.append((summed / library.teacher[cost], sum(library.losses[i][p] for i, p in enumerate(picks))))
    return found


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("cost", ["params", "kv_cache"])
def test_the_curve_is_the_least_loss_every_budget_buys_and_the_choice_that_budget_makes(seed: int, cost: str) -> None:
    library = drawn_library(seed)
    curve, choices = frontier(library, cost), every_choice(library, cost)
    assert [point[0] for point in curve] == sorted({point[0] for point in curve})  # cheapest first, one per cost
    assert all(a[1] > b[1] for a, b in itertools.pairwise(curve))  # each dearer point buys less loss
    for budget in sorted({fraction for fraction, _ in choices}):
        best = min(loss for fraction, loss in choices if fraction <= budget)
        bought = [loss for fraction, loss in curve if fraction <= budget][-1]
        assert bought == pytest.approx(best, abs=1e-9), budget  # brute force over every choice
    for fraction, loss in curve:  # the budget's own choice (the mixed-integer program) lands on the curve
        picks, _ = choose_from(library, Budget(**{cost: min(fraction + 1e-9, 1.0)}))
        assert sum(library.losses[i][p] for i, p in enumerate(picks)) == pytest.approx(loss, abs=1e-9)


def test_a_curve_on_a_cost_the_library_lacks_is_refused_naming_the_ones_it_has() -> None:
    library = drawn_library(0)
    with pytest.raises(SpecError, match=r"no latency cost to draw a curve on \(it has params, kv_cache\)"):
        frontier(library, "latency")


def architecture_of(library: Library, budget: dict[str, float]) -> Architecture:
    picks, chosen_by = choose_from(library, Budget(**budget))
    return chosen_architecture(library, picks, Budget(**budget), chosen_by)


def test_the_page_marks_every_choice_on_each_costs_curve() -> None:
    library = drawn_library(1)
    search = architecture_of(library, {"params": 0.5})
    again = architecture_of(library, {"params": 0.8, "kv_cache": 0.5})
    chart = tradeoff_chart(
        search, "held-out loss", [Choice("the search", search, 14.5), Choice("choice 1", again, 16.0)]
    )
    assert chart is not None and [panel.cost for panel in chart.panels] == ["params", "kv_cache"]
    for panel in chart.panels:
        assert panel.curve == frontier(library, panel.cost)
        losses = [loss for _, loss in panel.curve] + [mark.loss for mark in panel.marks]
        assert (panel.low, panel.high) == (min(losses), max(losses))
        for mark, architecture in zip(panel.marks, [search, again], strict=True):
            assert architecture.reached is not None
            assert mark.fraction == architecture.reached[panel.cost]
            assert mark.loss == pytest.approx(sum(block.loss or 0.0 for block in architecture.blocks))
            assert mark.x == round(LEFT + (WIDTH - RIGHT - LEFT) * mark.fraction / panel.high_fraction, 1)
            span = panel.high - panel.low
            assert mark.y == round(HEIGHT - BOTTOM - (HEIGHT - BOTTOM - TOP) * (mark.loss - panel.low) / span, 1)
    params = chart.panels[0]
    assert [(m.label, m.budget, m.perplexity) for m in params.marks] == [
        ("the search", "params 0.5", 14.5),
        ("choice 1", "params 0.8, kv_cache 0.5", 16.0),
    ]
    on_curve = [loss for fraction, loss in params.curve if fraction <= params.marks[0].fraction][-1]
    assert params.marks[0].loss == pytest.approx(on_curve)  # a budget on params alone chooses on its curve
    (cheapest, its_loss), steps = params.curve[0], len(params.curve) - 1
    x0 = round(LEFT + (WIDTH - RIGHT - LEFT) * cheapest / params.high_fraction, 1)
    y0 = round(HEIGHT - BOTTOM - (HEIGHT - BOTTOM - TOP) * (its_loss - params.low) / (params.high - params.low), 1)
    assert params.path.startswith(f"M {x0} {y0} H ") and params.path.count(" V ") == steps  # a step per point


def test_the_chart_renders_a_panel_per_cost_and_a_row_per_choice() -> None:
    library = drawn_library(2)
    search = architecture_of(library, {"params": 0.6})
    chart = tradeoff_chart(search, "held-out loss", [Choice("the search", search, 12.345)])
    html = templates.get_template("partials/tradeoff_chart.html").render(chart=chart)
    assert re.findall(r'<svg id="(tradeoff-[a-z_]+)"', html) == ["tradeoff-params", "tradeoff-kv_cache"]
    assert html.count('data-choice="the search"') == 3  # a dot on each panel, a row in the table
    assert chart is not None and f'd="{chart.panels[0].path}"' in html
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))
    fraction = (search.reached or {})["params"]
    assert f"the search params 0.6 {100 * fraction:.1f}%" in text and "12.35" in text


def test_an_architecture_without_a_library_has_no_chart() -> None:
    plain = Architecture(blocks=[ArchitectureBlock(block=0, layers=["ffn_1/2"])])
    assert tradeoff_chart(plain, "held-out loss", []) is None
    one = CandidateResult(block=0, name="keep", loss=0.0, params=10)
    assert tradeoff_chart(Architecture(blocks=plain.blocks, candidates=[one]), "held-out loss", []) is not None


def test_the_outcome_part_shows_the_chart_under_the_layers_table() -> None:
    library = drawn_library(0)
    search = architecture_of(library, {"params": 0.5})
    view = OutcomeView(names=NAMES, layers=layer_choices(search)[1], costs=costs_of(search))
    view.tradeoff = tradeoff_chart(search, "held-out loss", [Choice("the search", search, None)])
    html = templates.get_template("partials/outcome.html").render(outcome=view)
    assert html.index('id="outcome-layers"') < html.index('id="tradeoff"') < html.index('id="tradeoff-params"')
    assert "<circle" in html and 'data-choice="the search"' in html
    view.tradeoff = None  # a compression, or a NAS search: no library, no chart
    assert 'id="tradeoff"' not in templates.get_template("partials/outcome.html").render(outcome=view)
