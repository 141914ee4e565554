"""Small exact solvers both phases' planners share: the min-max contiguous cut of a list of costs
(`balanced_partition`) and the longest-first assignment of independent items to ranks."""

from __future__ import annotations

from pipebd_core.documents.errors import PlanError


def balanced_partition(costs: list[float], parts: int) -> list[tuple[int, int]]:
    """Split blocks into `parts` contiguous ranges minimising the largest range cost (exact DP)."""
    count = len(costs)
    if parts > count:
        raise PlanError(f"{parts} stages need at least {parts} blocks, the workload has {count}")
    prefix = [0.0]
    for cost in costs:
        prefix.append(prefix[-1] + cost)
    inf = float("inf")
    best = [[inf] * (count + 1) for _ in range(parts + 1)]
    cut = [[0] * (count + 1) for _ in range(parts + 1)]
    best[0][0] = 0.0
    for k in range(1, parts + 1):
        for end in range(k, count + 1):
            for start in range(k - 1, end):
                value = max(best[k - 1][start], prefix[end] - prefix[start])
                if value < best[k][end]:
                    best[k][end], cut[k][end] = value, start
    ranges, end = [], count
    for k in range(parts, 0, -1):
        start = cut[k][end]
        ranges.append((start, end))
        end = start
    return ranges[::-1]


def longest_first_assignment(costs: list[float], nproc: int) -> list[list[int]]:
    """Layerwise scheduling: each block, longest first, onto the least-loaded rank (ties: lowest rank)."""
    loads = [0.0] * nproc
    assignment: list[list[int]] = [[] for _ in range(nproc)]
    for block in sorted(range(len(costs)), key=lambda b: (-costs[b], b)):
        rank = min(range(nproc), key=lambda r: (loads[r], r))
        loads[rank] += costs[block]
        assignment[rank].append(block)
    return [sorted(blocks) for blocks in assignment]
