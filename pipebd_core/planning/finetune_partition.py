"""Cutting a network's layers into pipeline stages: three partitioners behind one interface.

A partitioner takes each layer's cost per micro-batch (`LayerCost`: forward F, input gradient delta,
weight gradient G, whether its delta is movable and what splitting it costs) and the number of stages,
and returns a `Partition`: one contiguous range of layers per stage and, per boundary s -> s+1, the
share of the boundary layer's delta (the last layer of stage s) that stage s+1 computes. They are pure
functions; the planner (planning/finetune_planner.py) turns the shares into channels and the simulator replays
the result.

    even        equal layer counts (the first stages take one more where they do not divide)
    pipedream   PipeDream's layer-granular partition: the exact min-max cut of F + delta + G, by the
                dynamic programme of `pipebd_core.planning.balance.balanced_partition`
    layerpipe   LayerPipe's Algorithm 1 (Unnikrishnan and Parhi, ICCAD 2021): the target T_p = T_total / N;
                the layers taken in reverse and each put on the current processor (the last one first)
                while it fits; a layer that does not fit becomes the last layer of the processor before,
                and the current processor takes as much of its movable delta as still fits (delta'', the
                rest delta' stays with the layer); when more than N processors would be needed, T_p is
                relaxed by ALPHA and the fill starts again. Where the paper stops at the first target that
                fits, we then bisect between it and the last one that did not, so the result is not up to
                ALPHA worse than the fill can do; that is what makes it never worse than pipedream (the
                fill at pipedream's slowest stage always fits: without moves it is the greedy contiguous
                cut, and every move only lightens the processor before)

Movable is decided by the planner: a layer whose delta can be split along its input channels
(moved.split_channels) and whose move costs little communication and memory next to the work it moves.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pipebd_core.planning.balance import balanced_partition

ALPHA = 1.05  # LayerPipe's relaxation of the target per round when N processors do not suffice
BISECTIONS = 60  # halvings of the gap between the last target that did not fit and the first that did


@dataclass(frozen=True)
class LayerCost:
    """One layer's seconds per micro-batch on a pipeline stage."""

    f: float  # forward
    delta: float  # input gradient: what a later stage can take over a share of
    g: float  # weight gradient
    movable: bool = False
    split_s: float = 0.0  # what each of the two pieces of a split delta costs beyond its share of the work

    @property
    def total(self) -> float:
        return self.f + self.delta + self.g


@dataclass(frozen=True)
class Partition:
    partitioner: str
    stages: list[tuple[int, int]]  # per stage, layers [start, stop)
    moved: list[float]  # per boundary s -> s+1, the share of layer stages[s][1] - 1's delta on stage s+1
    target_s: float | None = None  # layerpipe: the per-processor target it met
    rounds: int = 0  # layerpipe: the alpha relaxations it took


@dataclass(frozen=True)
class StageWork:
    """A stage's seconds per micro-batch: F, delta (its own, less the share it gives, plus the share it takes,
    each split piece with its cost) and G."""

    f: float
    delta: float
    g: float

    @property
    def total(self) -> float:
        return self.f + self.delta + self.g


def stage_work(
    costs: Sequence[LayerCost], stages: Sequence[tuple[int, int]], moved: Sequence[float]
) -> list[StageWork]:
    """Every stage's work under `stages` with the shares `moved` across its boundaries."""
    work = []
    for s, (start, stop) in enumerate(stages):
        layers = costs[start:stop]
        delta = sum(c.delta for c in layers)
        if s < len(moved) and moved[s] > 0:
            boundary = costs[stop - 1]
            delta -= moved[s] * boundary.delta - boundary.split_s
        if s > 0 and moved[s - 1] > 0:
            delta += moved[s - 1] * costs[start - 1].delta + costs[start - 1].split_s
        work.append(StageWork(sum(c.f for c in layers), delta, sum(c.g for c in layers)))
    return work


def slowest(costs: Sequence[LayerCost], partition: Partition) -> float:
    return max(w.total for w in stage_work(costs, partition.stages, partition.moved))


def even(costs: Sequence[LayerCost], parts: int) -> Partition:
    """Equal layer counts, the remainder one each to the first stages."""
    base, extra = divmod(len(costs), parts)
    stages, start = [], 0
    for s in range(parts):
        stop = start + base + (1 if s < extra else 0)
        stages.append((start, stop))
        start = stop
    return Partition("even", stages, [0.0] * (parts - 1))


def pipedream(costs: Sequence[LayerCost], parts: int) -> Partition:
    """The exact min-max layer-granular cut of F + delta + G."""
    return Partition("pipedream", balanced_partition([c.total for c in costs], parts), [0.0] * (parts - 1))


def layerpipe(costs: Sequence[LayerCost], parts: int) -> Partition:
    """Algorithm 1 with its alpha relaxation, then bisection to the tightest target the fill meets."""
    if parts > len(costs):
        raise ValueError(f"{parts} stages need at least {parts} layers, the network has {len(costs)}")
    target, rounds = sum(c.total for c in costs) / parts, 0
    fitted = _fill(costs, parts, target)
    while fitted is None:
        target, rounds = target * ALPHA, rounds + 1
        fitted = _fill(costs, parts, target)
    if rounds:
        low, high = target / ALPHA, target
        for _ in range(BISECTIONS):
            middle = (low + high) / 2
            attempt = _fill(costs, parts, middle)
            if attempt is None:
                low = middle
            else:
                high, fitted = middle, attempt
        target = high
    stages, moved = _fill_to(costs, parts, *fitted)
    return Partition("layerpipe", stages, moved, target, rounds)


def _fill(costs: Sequence[LayerCost], parts: int, cap: float) -> tuple[list[tuple[int, int]], list[float]] | None:
    """Fill processors from the last layer backwards, each up to `cap` seconds (see the module's docstring);
    None when more than `parts` processors would be needed."""
    stages: list[tuple[int, int]] = []
    moved: list[float] = []
    stop, load = len(costs), 0.0
    for index in range(len(costs) - 1, -1, -1):
        cost = costs[index]
        if load + cost.total <= cap:
            load += cost.total
            continue
        if len(stages) == parts - 1 or index == len(costs) - 1:
            return None  # no processor left, or the last layer alone exceeds the target
        share = _share(cost, cap - load)
        stages.append((index + 1, stop))
        moved.append(share)
        stop = index + 1
        load = cost.total - share * cost.delta + (cost.split_s if share else 0.0)
        if load > cap:
            return None
    stages.append((0, stop))
    return stages[::-1], moved[::-1]


def _share(cost: LayerCost, idle: float) -> float:
    """How much of a boundary layer's delta the later processor takes into its `idle` seconds: all that
    fits with the cost of its piece, unless that relieves the owner less than the owner's piece costs."""
    if not cost.movable or cost.delta <= 0 or idle <= cost.split_s:
        return 0.0
    share = min(1.0, (idle - cost.split_s) / cost.delta)
    return share if share * cost.delta > cost.split_s else 0.0


def _fill_to(
    costs: Sequence[LayerCost], parts: int, stages: list[tuple[int, int]], moved: list[float]
) -> tuple[list[tuple[int, int]], list[float]]:
    """`parts` stages from a fill that needed fewer: the heaviest stage of several layers cut in two by
    the min-max cut (neither half is heavier than the whole), until there are enough."""
    stages, moved = list(stages), list(moved)
    while len(stages) < parts:
        work = stage_work(costs, stages, moved)
        s = max((s for s, (a, b) in enumerate(stages) if b - a > 1), key=lambda s: work[s].total)
        start, stop = stages[s]
        (_, cut), _ = balanced_partition([c.total for c in costs[start:stop]], 2)
        stages[s : s + 1] = [(start, start + cut), (start + cut, stop)]
        moved.insert(s, 0.0)
    return stages, moved


PARTITIONER_FUNCTIONS: dict[str, Callable[[Sequence[LayerCost], int], Partition]] = {
    "even": even,
    "pipedream": pipedream,
    "layerpipe": layerpipe,
}
