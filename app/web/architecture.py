"""The NAS part of a job page: each block's architecture probabilities over time, as heat maps.

Per block, a row per searchable layer and a column per architecture update (at most `MAX_COLUMNS`,
evenly spaced, the first and the newest always among them). A cell holds the probability, at that
update, of the candidate the layer would choose now (its most probable candidate at the newest
update), so a row shows how the search settled on its choice; a cell where another candidate was in
the lead names it. Candidates are named as in pipebd_core/workloads/search_space.py (MBConv kernel x
expansion, then `zero` where a layer may be skipped).
"""

from __future__ import annotations

from dataclasses import dataclass

from pipebd_core.workloads.search_space import CANDIDATES, ZERO, candidate_name

MAX_COLUMNS = 24  # updates drawn per block: enough to see the trend, narrow enough to read
NAMES = [candidate_name(kernel, expansion) for kernel, expansion in CANDIDATES] + [ZERO]


def candidate_names(count: int) -> list[str]:
    """The names of a layer's `count` candidates: the supernet's (with `zero` as the seventh), or
    c0, c1, ... for a layer that is not one of its mixed layers."""
    if count in (len(CANDIDATES), len(CANDIDATES) + 1):
        return NAMES[:count]
    return [f"c{index}" for index in range(count)]


def spaced(count: int, most: int) -> list[int]:
    """At most `most` indices of `count` items, evenly spaced, the first and the last included."""
    if count <= most:
        return list(range(count))
    if most < 2:
        return [count - 1]
    return sorted({round(i * (count - 1) / (most - 1)) for i in range(most)})


def _leader(probabilities: list[float]) -> int:
    return max(range(len(probabilities)), key=probabilities.__getitem__)


@dataclass(frozen=True)
class HistoryCell:
    step: int
    p: float  # probability of the layer's choice (its leader at the newest update) at this update
    leader: str  # the most probable candidate at this update
    leader_p: float

    @property
    def other_leads(self) -> bool:
        return self.leader_p > self.p


@dataclass(frozen=True)
class LayerHistory:
    index: int
    chosen: str  # the most probable candidate at the newest update: what the search would pick now
    chosen_p: float
    cells: list[HistoryCell | None]  # one per drawn update
    latest: list[tuple[str, float]]  # every candidate's probability at the newest update


@dataclass(frozen=True)
class BlockHistory:
    block: int
    name: str | None
    steps: list[int]  # the updates drawn (columns)
    updates: int  # every update of the block, drawn or not
    layers: list[LayerHistory]
    candidates: list[str]  # the names of the widest layer's candidates (the latest table's columns)

    @property
    def latest_step(self) -> int:
        return self.steps[-1]

    @property
    def thinned(self) -> bool:
        return len(self.steps) < self.updates


def block_history(
    block: int,
    updates: list[tuple[int, list[list[float]]]],
    name: str | None = None,
    most: int = MAX_COLUMNS,
    total: int | None = None,
) -> BlockHistory:
    """The heat map of one block from its updates (step, layers x candidates), oldest first; `total`:
    how many updates there were, when `updates` holds only some of them (already thinned)."""
    drawn = [updates[index] for index in spaced(len(updates), most)]
    newest = updates[-1][1]
    layers = []
    for index, latest in enumerate(newest):
        names = candidate_names(len(latest))
        choice = _leader(latest)
        cells: list[HistoryCell | None] = []
        for step, then in drawn:
            if index >= len(then) or len(then[index]) != len(latest):
                cells.append(None)  # the layer had other candidates then (not within one search)
                continue
            leader = _leader(then[index])
            cells.append(HistoryCell(step, then[index][choice], names[leader], then[index][leader]))
        layers.append(LayerHistory(index, names[choice], latest[choice], cells, list(zip(names, latest, strict=True))))
    widest = max((len(latest) for latest in newest), default=0)
    steps = [step for step, _ in drawn]
    return BlockHistory(block, name, steps, max(total or 0, len(updates)), layers, candidate_names(widest))


def architecture_view(
    history: dict[int, list[tuple[int, list[list[float]]]]],
    block_names: list[str],
    updates: dict[int, int] | None = None,
    most: int = MAX_COLUMNS,
) -> list[BlockHistory]:
    """Every block with at least one update, in block order; `updates`: per block, how many architecture
    updates it had, when `history` holds only some of them."""
    return [
        block_history(
            block, found, block_names[block] if block < len(block_names) else None, most, (updates or {}).get(block)
        )
        for block, found in sorted(history.items())
        if found
    ]
