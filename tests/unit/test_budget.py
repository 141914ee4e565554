"""tier: pure logic

The budgeted choice of a search (pipebd_core/workloads/budget.py): one candidate per layer, the lowest
summed loss within one cost budget or two at once, against brute force over every choice of small random instances; a
budget no choice meets is refused with the cheapest reachable cost.
"""

from __future__ import annotations

import itertools
import random

import pytest

from pipebd_core.workloads.budget import BudgetError, Limit, choose, smallest_cost


def brute_force(losses: list[list[float]], limits: list[Limit]) -> float | None:
    """The smallest summed loss of any choice within every budget (None: no choice meets them)."""
    best = None
    for picks in itertools.product(*(range(len(layer)) for layer in losses)):
        if all(sum(limit.costs[layer][pick] for layer, pick in enumerate(picks)) <= limit.budget for limit in limits):
            loss = sum(losses[layer][pick] for layer, pick in enumerate(picks))
            best = loss if best is None else min(best, loss)
    return best


def random_limit(rng: random.Random, sizes: list[int]) -> Limit:
    costs = [[float(rng.randint(0, 20)) for _ in range(size)] for size in sizes]
    return Limit(costs, rng.uniform(smallest_cost(costs), sum(max(layer) for layer in costs)))


@pytest.mark.parametrize("seed", range(40))
def test_the_choice_is_the_best_one_within_the_budget(seed: int) -> None:
    rng = random.Random(seed)
    layers = rng.randint(1, 5)
    sizes = [rng.randint(1, 4) for _ in range(layers)]
    losses = [[rng.random() for _ in range(size)] for size in sizes]
    limit = random_limit(rng, sizes)
    choice = choose(losses, [limit])
    best = brute_force(losses, [limit])
    assert best is not None and choice.loss == pytest.approx(best, abs=1e-9)
    assert choice.cost <= limit.budget + 1e-9
    assert choice.cost == pytest.approx(sum(limit.costs[layer][pick] for layer, pick in enumerate(choice.picks)))
    assert choice.loss == pytest.approx(sum(losses[layer][pick] for layer, pick in enumerate(choice.picks)))


@pytest.mark.parametrize("seed", range(30))
def test_two_budgets_at_once_give_the_best_choice_within_both(seed: int) -> None:
    """Parameters and KV-cache bytes bounded together; budgets each reachable may exclude each other."""
    rng = random.Random(100 + seed)
    sizes = [rng.randint(1, 4) for _ in range(rng.randint(1, 5))]
    losses = [[rng.random() for _ in range(size)] for size in sizes]
    limits = [random_limit(rng, sizes), random_limit(rng, sizes)]
    best = brute_force(losses, limits)
    if best is None:
        with pytest.raises(BudgetError, match="no choice meets every budget at once"):
            choose(losses, limits)
        return
    choice = choose(losses, limits)
    assert choice.loss == pytest.approx(best, abs=1e-9)
    for limit in limits:
        assert sum(limit.costs[layer][pick] for layer, pick in enumerate(choice.picks)) <= limit.budget + 1e-9


def test_a_budget_below_the_cheapest_choice_is_refused_naming_it() -> None:
    losses, costs = [[0.1, 0.5], [0.2, 0.9]], [[10.0, 4.0], [8.0, 3.0]]
    with pytest.raises(BudgetError, match="the cheapest choice costs 7"):
        choose(losses, [Limit(costs, 6.9)])
    assert choose(losses, [Limit(costs, 7.0)]).picks == [1, 1]  # exactly the cheapest
    assert choose(losses, [Limit(costs, 18.0)]).picks == [0, 0]  # room for the best of every layer


def test_losses_and_costs_of_other_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="one value per candidate"):
        choose([[0.1, 0.2]], [Limit([[1.0]], 5.0)])


@pytest.mark.parametrize("unit", [1.0, 1e-4, 1e6], ids=["ones", "seconds-of-latency", "parameters"])
def test_a_choice_over_the_budget_by_less_than_the_solvers_tolerance_is_never_taken(unit: float) -> None:
    """Both layers kept cost 2 units, a hair over the budget; the choice must drop one (loss 1), whatever
    the unit the costs come in (forward seconds of 1e-4 sit below the solver's absolute tolerance)."""
    losses = [[0.0, 1.0], [0.0, 1.0]]
    costs = [[unit, 0.0], [unit, 0.0]]
    budget = 2 * unit * (1 - 1e-9)
    choice = choose(losses, [Limit(costs, budget)])
    assert choice.loss == 1.0 and choice.cost <= budget
