"""Plans: shards, routing from batch-range overlap, stage validation, partitioning. Tier: pure logic."""

from __future__ import annotations

import pytest

from pipebd_core.data.streams import shard_rows
from pipebd_core.distill.plan import Route, build_stages, routes_between
from pipebd_core.documents.errors import PlanError
from pipebd_core.planning.balance import balanced_partition, longest_first_assignment
from pipebd_core.planning.distill_planner import make_plan
from pipebd_core.spec import ScheduleSpec, StageSpec
from pipebd_core.workloads.probe import BlockProbe


def flops(teacher: list[float]) -> BlockProbe:
    """FLOP estimates where each block's stage cost is `teacher[i]` and its task cost the prefix sum."""
    count = len(teacher)
    return BlockProbe([], teacher, [0.0] * count, [0] * count, [0] * count)


def stages(*triples: tuple[int, int, int]) -> list[StageSpec]:
    return [StageSpec(start=a, stop=b, replicas=r) for a, b, r in triples]


def test_shards_differ_by_at_most_one_row_and_cover_the_batch() -> None:
    assert shard_rows(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert shard_rows(64, 1) == [(0, 64)]
    for batch in range(1, 30):
        for replicas in range(1, batch + 1):
            rows = shard_rows(batch, replicas)
            sizes = [b - a for a, b in rows]
            assert max(sizes) - min(sizes) <= 1 and rows[0][0] == 0 and rows[-1][1] == batch
            assert all(rows[i][1] == rows[i + 1][0] for i in range(replicas - 1))


def test_a_batch_smaller_than_the_replicas_is_refused() -> None:
    with pytest.raises(PlanError, match="a batch of 2 rows cannot be split over 3 replicas"):
        shard_rows(2, 3)


def test_routes_follow_the_overlap_of_row_ranges() -> None:
    producer, consumer = build_stages(stages((0, 2, 2), (2, 4, 3)), 5, 4, 10)
    routes = routes_between(producer, consumer)
    assert routes == [
        Route(0, 2, 2, 0, 4),
        Route(0, 3, 2, 4, 5),
        Route(1, 3, 2, 5, 7),
        Route(1, 4, 2, 7, 10),
    ]
    # every consumer receives exactly its rows
    for rank, (start, stop) in zip(consumer.ranks, consumer.rows, strict=True):
        received = sorted((r.start, r.stop) for r in routes if r.dst == rank)
        assert received[0][0] == start and received[-1][1] == stop


def test_one_to_many_and_many_to_one() -> None:
    one, two = build_stages(stages((0, 1, 1), (1, 3, 2)), 3, 3, 64)
    assert routes_between(one, two) == [Route(0, 1, 1, 0, 32), Route(0, 2, 1, 32, 64)]
    two, one = build_stages(stages((0, 1, 2), (1, 3, 1)), 3, 3, 64)
    assert routes_between(two, one) == [Route(0, 2, 1, 0, 32), Route(1, 2, 1, 32, 64)]


@pytest.mark.parametrize(
    ("specs", "nproc", "blocks", "message"),
    [
        (stages((0, 1, 1), (1, 2, 1), (2, 3, 1)), 3, 2, "3 stages but the workload has only 2 blocks"),
        (stages((0, 2, 1), (2, 4, 2)), 2, 4, "stage replicas sum to 3 but nproc is 2"),
        (stages((0, 2, 1), (3, 4, 1)), 2, 4, "stages[1] starts at block 3 but must start at 2"),
        (stages((0, 2, 1), (2, 3, 1)), 2, 4, "the last stage stops at block 3 but the workload has 4 blocks"),
        (stages((1, 4, 2)), 2, 4, "stages[0] starts at block 1 but must start at 0"),
    ],
)
def test_invalid_stages_say_what_would_work(specs: list[StageSpec], nproc: int, blocks: int, message: str) -> None:
    with pytest.raises(PlanError, match=message.replace("[", r"\[").replace("]", r"\]")):
        build_stages(specs, nproc, blocks, 64)


def test_balanced_partition_is_exact_on_small_cases() -> None:
    assert balanced_partition([1, 2, 3, 4, 5, 6], 2) == [(0, 4), (4, 6)]
    assert balanced_partition([5, 1, 1, 1, 1, 5], 3) == [(0, 1), (1, 5), (5, 6)]
    assert balanced_partition([1, 1, 1], 3) == [(0, 1), (1, 2), (2, 3)]


def test_longest_first_goes_to_the_least_loaded_rank() -> None:
    assert longest_first_assignment([1, 5, 3, 2], 2) == [[0, 1], [2, 3]]  # 5 | 3, 2 | then 1 on the tie: rank 0
    assert longest_first_assignment([4, 4, 4], 4) == [[0], [1], [2], []]


def test_make_plan_modes() -> None:
    even = flops([1.0, 1.0, 1.0, 1.0])  # stage costs 1 each, task costs (prefix) 1, 2, 3, 4
    tr = make_plan(ScheduleSpec(mode="tr", nproc=2, profile=False), 4, 8, even, None)
    assert [(s.start, s.stop, s.ranks) for s in tr.stages] == [(0, 2, (0,)), (2, 4, (1,))]
    ir = make_plan(ScheduleSpec(mode="ir", nproc=3, profile=False), 4, 8, even, None)
    assert ir.stages[0].rows == ((0, 3), (3, 6), (6, 8))
    ls = make_plan(ScheduleSpec(mode="ls", nproc=2, profile=False), 4, 8, even, None)
    assert ls.assignment == [[0, 3], [1, 2]]


def test_make_plan_refusals_are_explained() -> None:
    two = flops([1.0, 1.0])
    with pytest.raises(PlanError, match="use --nproc 2 or fewer"):
        make_plan(ScheduleSpec(mode="tr_dpu", nproc=3, profile=False), 2, 8, two, None)
    with pytest.raises(PlanError, match="use mode 'hybrid' for replicated stages"):
        schedule = ScheduleSpec(mode="tr", nproc=3, stages=stages((0, 1, 2), (1, 2, 1)), profile=False)
        make_plan(schedule, 2, 8, two, None)
    with pytest.raises(PlanError, match="cannot be split over 4 replicas"):
        make_plan(ScheduleSpec(mode="dp", nproc=4, profile=False), 2, 3, two, None)
