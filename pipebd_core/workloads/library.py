"""A search's candidate library, and the choice made from it: at the end of the search, and again later for
another budget, in seconds and without training anything (Puzzletron's `--mip-only`).

A transformer search trains every candidate of every layer (the expensive part) and measures each one's
held-out loss and costs; architecture.json keeps them all (`Architecture.candidates`). The choice is a
function of that record and the budget only: `choose_from` picks one candidate per layer (the lowest
loss, or the lowest summed loss within the budget: budget.py), `chosen_architecture` writes the choice
down. The finalize phase's first choice and every later one (distill/choose.py) go through these two
functions, so the same library and budget give the same architecture either way. Torch-free.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pipebd_core.documents.architecture import Architecture, ArchitectureBlock, CandidateResult
from pipebd_core.spec import Budget, SpecError
from pipebd_core.workloads.budget import BudgetError, Limit, choose, smallest_cost

Costs = dict[str, Sequence[Sequence[float]]]  # per cost (workload.budget's names), per layer, per candidate
CHEAPER = {  # where a budget cannot be met: the replacements that cost less of it
    "params": "ffn_1/4, linear or noop",
    "kv_cache": "kv_1, linear_attention, no_attention, linear or noop",
    "latency": "linear or noop",
}
MEASURES = {  # workload.search_loss: what a candidate's loss in architecture.json is
    "block": "held-out loss",
    "logits_kl": "KL of the teacher's logits with the layer swapped in",
}
RECORDED = {"params": "params", "kv_cache": "kv_cache_bytes", "latency": "latency_s"}  # architecture.json's names


@dataclass(frozen=True)
class Library:
    """Every candidate of every layer: its name, measured loss and costs; and the teacher's costs."""

    names: list[list[str]]  # per layer, the candidates in the order the workload built them
    losses: list[list[float]]
    costs: Costs  # the costs known: params always, kv_cache and latency where measured
    teacher: dict[str, float]  # the teacher's layers' summed cost, by the same names
    measure: str  # what a loss is (workload.search_loss's description)


def library_of(architecture: Architecture, measure: str) -> Library:
    """The library a finished search recorded in its architecture.json."""
    if not architecture.candidates:
        raise SpecError(
            "this job's architecture.json has no candidate library: only a transformer search records one;"
            " run a search (workload.replacements with several candidates) to choose again"
        )
    layers = max(candidate.block for candidate in architecture.candidates) + 1
    names: list[list[str]] = [[] for _ in range(layers)]
    losses: list[list[float]] = [[] for _ in range(layers)]
    recorded: dict[str, list[list[float]]] = {name: [[] for _ in range(layers)] for name in RECORDED}
    for candidate in architecture.candidates:
        names[candidate.block].append(candidate.name)
        losses[candidate.block].append(candidate.loss)
        for name, field in RECORDED.items():
            value = getattr(candidate, field)
            if value is not None or name == "kv_cache":  # an encoder's layers keep no KV cache: 0, as measured
                recorded[name][candidate.block].append(float(value or 0))
    costs: Costs = {name: layers_ for name, layers_ in recorded.items() if all(layers_)}
    teacher = {
        "params": float(architecture.teacher_params or 0),
        "kv_cache": float(architecture.teacher_kv_cache_bytes or 0),
        "latency": float(architecture.teacher_latency_s or 0),
    }
    return Library(names, losses, costs, {name: teacher[name] for name in costs}, measure)


def check_fractions(budget: Budget, costs: Costs, teacher: dict[str, float]) -> None:
    """Refuse a budget that no choice of one candidate per layer meets: each bound alone, naming the smallest
    fraction the candidates reach, then all of them at once."""
    for name, fraction in budget.fractions().items():
        if name not in costs:
            continue
        if teacher[name] == 0:
            raise SpecError(
                f"workload.budget.{name}: this teacher's layers have none (a vision transformer's encoder keeps no"
                " KV cache), so there is nothing to bound; budget params instead"
            )
        cheapest = smallest_cost(costs[name])
        if cheapest > fraction * teacher[name]:
            reachable = cheapest / teacher[name]
            raise SpecError(
                f"workload.budget.{name}: {fraction:g} of the teacher's layers is below what these replacements"
                f" can reach ({reachable:.3f} with the cheapest candidate of every layer); allow at least"
                f" {reachable:.3f}, or add cheaper candidates ({CHEAPER[name]})"
            )
    try:
        choose([[0.0] * len(layer) for layer in costs["params"]], budget_limits(budget, costs, teacher))
    except BudgetError:
        raise SpecError(
            f"workload.budget: {budget.fractions()} are each reachable, but no one choice of a candidate per layer"
            " meets them all at once; loosen one of them, or add candidates cheap in both"
        ) from None


def budget_limits(budget: Budget, costs: Costs, teacher: dict[str, float]) -> list[Limit]:
    """The budget as the choice's limits: each fraction given, times the teacher's cost (a cost not known
    yet, latency before the profile, left out)."""
    return [
        Limit(costs[name], fraction * teacher[name]) for name, fraction in budget.fractions().items() if name in costs
    ]


def choose_from(library: Library, budget: Budget | None) -> tuple[list[int], str]:
    """Per layer the chosen candidate's index, and the rule it followed: the lowest loss without a budget,
    the lowest summed loss within it otherwise (a budget no choice meets is refused, naming what would)."""
    if budget is None:
        return [min(range(len(layer)), key=layer.__getitem__) for layer in library.losses], f"lowest {library.measure}"
    missing = [name for name in budget.fractions() if name not in library.costs]
    if missing:
        raise SpecError(
            f"workload.budget.{missing[0]}: this search recorded no {missing[0]} cost for its candidates (latency"
            f" is measured by a profiled search); budget {' or '.join(library.costs)} instead"
        )
    check_fractions(budget, library.costs, library.teacher)
    picks = choose(library.losses, budget_limits(budget, library.costs, library.teacher)).picks
    return picks, f"lowest summed {library.measure} within the budget (mixed-integer program)"


def reached(costs: Sequence[Sequence[float]], picks: Sequence[int], teacher: float) -> float:
    """The chosen candidates' summed cost, as a fraction of the teacher's (0 where the teacher's is 0)."""
    return sum(layer[pick] for layer, pick in zip(costs, picks, strict=True)) / teacher if teacher else 0.0


def _recorded(library: Library, layer: int, candidate: int) -> dict[str, float]:
    """One candidate's costs as architecture.json names them (those the teacher has)."""
    found: dict[str, float] = {}
    for name, field in RECORDED.items():
        if name in library.costs and library.teacher.get(name):
            value = library.costs[name][layer][candidate]
            found[field] = int(value) if name != "latency" else value
    return found


def chosen_architecture(library: Library, picks: Sequence[int], budget: Budget | None, chosen_by: str) -> Architecture:
    """architecture.json of a choice: the chosen candidates, every candidate's record, what the choice reached."""
    shown = {name: layers for name, layers in library.costs.items() if library.teacher.get(name)}
    return Architecture(
        blocks=[
            ArchitectureBlock(
                block=i, layers=[library.names[i][pick]], loss=library.losses[i][pick], **_recorded(library, i, pick)
            )
            for i, pick in enumerate(picks)
        ],
        candidates=[
            CandidateResult(block=i, name=name, loss=library.losses[i][c], **_recorded(library, i, c))
            for i, names in enumerate(library.names)
            for c, name in enumerate(names)
        ],
        chosen_by=chosen_by,
        teacher_params=int(library.teacher["params"]),
        teacher_kv_cache_bytes=int(library.teacher["kv_cache"]) if "kv_cache" in shown else None,
        teacher_latency_s=library.teacher.get("latency"),
        budget=None if budget is None else budget.fractions(),
        reached={name: reached(layers, picks, library.teacher[name]) for name, layers in shown.items()},
    )


def frontier(library: Library, cost: str) -> list[tuple[float, float]]:
    """The library's trade-off curve on one cost: each (summed cost as a fraction of the teacher's, least summed
    loss) that a choice of one candidate per layer reaches with no cheaper choice as good, cheapest first. A
    budget on that cost alone at fraction f chooses the last point at or below f, so the curve is what every
    such budget buys. Exact: layer by layer, the sums of the points so far with each candidate, the dominated
    ones dropped (no solver)."""
    teacher = library.teacher.get(cost)
    if cost not in library.costs or not teacher:
        raise SpecError(f"this library has no {cost} cost to draw a curve on (it has {', '.join(library.costs)})")
    points = [(0.0, 0.0)]
    for costs, losses in zip(library.costs[cost], library.losses, strict=True):
        sums = sorted((at + c, sofar + loss) for at, sofar in points for c, loss in zip(costs, losses, strict=True))
        points = []
        for summed, loss in sums:  # cheapest first, and at one cost the least loss first
            if not points or loss < points[-1][1]:
                points.append((summed, loss))
    return [(summed / teacher, loss) for summed, loss in points]
