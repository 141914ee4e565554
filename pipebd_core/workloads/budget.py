"""The budgeted choice of a search: one candidate per layer, the lowest total quality loss within a cost budget.

Puzzle's step after blockwise distillation: every layer has alternatives, each with a measured quality
loss (its held-out block loss) and costs (parameters, KV-cache bytes per token); pick one per layer so that
every summed cost stays within its budget and the summed loss is the smallest. It is a multiple-choice
knapsack, solved exactly as a mixed-integer program (`scipy.optimize.milp`, HiGHS): a binary x[l, c] per
candidate, one per layer, one row of costs per budget. Torch-free, so that a spec check can refuse a
budget no choice meets before anything launches.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


class BudgetError(ValueError):
    """No choice of one candidate per layer meets the budget."""


@dataclass(frozen=True)
class Choice:
    picks: list[int]  # per layer, the index of the chosen candidate
    loss: float  # their summed loss
    cost: float  # their summed cost


def smallest_cost(costs: Sequence[Sequence[float]]) -> float:
    """The cheapest network the candidates allow: the cheapest candidate of every layer."""
    return float(sum(min(layer) for layer in costs))


MAX_CUTS = 50  # re-solves, each cutting off a choice the solver's tolerance let over a budget


@dataclass(frozen=True)
class Limit:
    """One budget: per layer, each candidate's cost, and the most their sum may be."""

    costs: Sequence[Sequence[float]]
    budget: float


def _solve(
    loss: np.ndarray,
    sizes: list[int],
    one_per_layer: np.ndarray,
    rows: list[np.ndarray],
    bounds: list[float],
    limits: Sequence[Limit],
) -> list[int]:
    """The mixed-integer program's choice, one candidate index per layer (BudgetError where none exists)."""
    # imported here: the API draws a library's curve through this module (app/web/tradeoff_chart.py), never solving
    from scipy.optimize import Bounds, LinearConstraint, milp

    constraints = [LinearConstraint(one_per_layer, lb=np.ones(len(sizes)), ub=np.ones(len(sizes)))]
    constraints += [
        LinearConstraint(row[np.newaxis, :], lb=-np.inf, ub=bound) for row, bound in zip(rows, bounds, strict=True)
    ]
    # losses of 1e-5 (a block's MSE) sit below the solver's absolute tolerances: solved at unit scale, to optimality
    scale = float(np.abs(loss).max()) or 1.0
    options = {"mip_rel_gap": 0.0}
    result = milp(
        loss / scale, constraints=constraints, integrality=np.ones(len(loss)), bounds=Bounds(0, 1), options=options
    )
    if result.x is None:  # limits met one at a time may still exclude each other
        budgets = ", ".join(f"{limit.budget:g}" for limit in limits)
        raise BudgetError(f"no choice meets every budget at once ({budgets}): {result.message}")
    chosen = np.round(result.x).astype(bool)
    picks, start = [], 0
    for size in sizes:
        picks.append(int(np.flatnonzero(chosen[start : start + size])[0]))
        start += size
    return picks


def choose(losses: Sequence[Sequence[float]], limits: Sequence[Limit]) -> Choice:
    """One candidate per layer minimising the summed loss with every limit's summed cost within its budget.
    A limit that no choice meets alone is refused with its cheapest choice; `cost` is the first limit's."""
    for limit in limits:
        costs = limit.costs
        if len(losses) != len(costs) or any(len(a) != len(b) or not a for a, b in zip(losses, costs, strict=True)):
            raise ValueError("losses and costs need one value per candidate of every layer, at least one per layer")
        if smallest_cost(costs) > limit.budget:
            raise BudgetError(
                f"no choice meets the budget: it allows {limit.budget:g}, the cheapest choice costs"
                f" {smallest_cost(costs):g}"
            )
    sizes = [len(layer) for layer in losses]
    loss = np.concatenate([np.asarray(layer, dtype=float) for layer in losses])
    one_per_layer = np.zeros((len(sizes), len(loss)))
    start = 0
    for layer, size in enumerate(sizes):
        one_per_layer[layer, start : start + size] = 1.0
        start += size
    # every limit at unit scale (its costs over its budget): seconds of latency, 1e-4 a layer, would otherwise
    # sit below the solver's feasibility tolerance and let a choice over the budget through
    rows = [np.concatenate([np.asarray(layer, dtype=float) for layer in limit.costs]) for limit in limits]
    scaled = [row / limit.budget if limit.budget > 0 else row for row, limit in zip(rows, limits, strict=True)]
    bounds = [1.0 if limit.budget > 0 else 0.0 for limit in limits]
    offsets = np.cumsum([0, *sizes[:-1]])
    for _ in range(MAX_CUTS):
        picks = _solve(loss, sizes, one_per_layer, scaled, bounds, limits)
        if all(sum(limit.costs[i][p] for i, p in enumerate(picks)) <= limit.budget for limit in limits):
            break
        # over a budget by less than the solver's tolerance: that very choice is cut off, and nothing else
        cut = np.zeros(len(loss))
        cut[[int(offset) + pick for offset, pick in zip(offsets, picks, strict=True)]] = 1.0
        scaled, bounds = [*scaled, cut], [*bounds, len(sizes) - 1.0]
    else:
        raise BudgetError(f"no choice found within the budgets after cutting off {MAX_CUTS} just over them")
    flat = [int(offset) + pick for offset, pick in zip(offsets, picks, strict=True)]
    first = limits[0].costs if limits else [[0.0] * size for size in sizes]
    return Choice(picks, float(loss[flat].sum()), float(sum(first[i][p] for i, p in enumerate(picks))))
