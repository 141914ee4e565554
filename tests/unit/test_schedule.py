"""Each mode's per-rank task order. Tier: pure logic."""

from __future__ import annotations

from pipebd_core.distill.plan import Plan
from pipebd_core.distill.schedule import WORLD, count_tasks, rank_tasks
from pipebd_core.planning.distill_planner import make_plan
from pipebd_core.spec import ScheduleSpec, StageSpec
from pipebd_core.workloads.probe import BlockProbe

ESTIMATES = BlockProbe([], [1.0] * 4, [0.0] * 4, [0] * 4, [0] * 4)  # equal blocks; tasks cost 1, 2, 3, 4


def plan_for(mode: str, nproc: int, stages: list[StageSpec] | None = None, batch: int = 10) -> Plan:
    return make_plan(ScheduleSpec(mode=mode, nproc=nproc, stages=stages, profile=False), 4, batch, ESTIMATES, None)


def test_dp_trains_blocks_one_after_another_rerunning_the_teacher_prefix() -> None:
    tasks = list(rank_tasks(plan_for("dp", 2), 1, 3, [0] * 4, None))
    assert [(t.train, t.step) for t in tasks[:4]] == [((0,), 0), ((0,), 1), ((0,), 2), ((1,), 0)]
    assert tasks[5].teacher == range(0, 2) and tasks[-1].teacher == range(0, 4)
    assert all(t.rows == (5, 10) and t.group == WORLD and t.loads_data for t in tasks)


def test_ls_runs_only_the_assigned_blocks_at_full_batch_alone() -> None:
    plan = plan_for("ls", 2)
    for rank in (0, 1):
        tasks = list(rank_tasks(plan, rank, 2, [0] * 4, None))
        assert sorted({t.train[0] for t in tasks}) == plan.assignment[rank]
        assert all(t.rows == (0, 10) and t.group is None and t.teacher.start == 0 for t in tasks)


def test_tr_relays_and_waits_at_a_barrier_while_tr_dpu_does_not() -> None:
    for mode, barrier in (("tr", True), ("tr_dpu", False)):
        plan = plan_for(mode, 2)
        first, second = (list(rank_tasks(plan, rank, 3, [0] * 4, None)) for rank in (0, 1))
        assert [t.step for t in first] == [0, 1, 2]
        assert first[0].loads_data and first[0].send and not first[0].receive
        assert second[0].receive and not second[0].send
        assert all(t.barrier is barrier for t in first + second)


def test_resume_skips_finished_steps() -> None:
    plan = plan_for("dp", 1)
    tasks = list(rank_tasks(plan, 0, 4, [4, 4, 2, 0], None))
    assert [(t.train[0], t.step) for t in tasks] == [(2, 2), (2, 3), (3, 0), (3, 1), (3, 2), (3, 3)]
    assert count_tasks(plan, 0, 4, [4, 4, 2, 0], None) == len(tasks)


def test_replicated_stage_combines_gradients_in_its_group() -> None:
    plan = plan_for("hybrid", 3, [StageSpec(start=0, stop=1, replicas=1), StageSpec(start=1, stop=4, replicas=2)])
    task = next(iter(rank_tasks(plan, 2, 1, [0] * 4, None)))
    assert task.group == 1 and task.rows == (5, 10) and task.train == (1, 2, 3)
    assert [(r.src, r.start, r.stop) for r in task.receive] == [(0, 5, 10)]


def per_block(mode: str, stages: list[StageSpec] | None = None) -> dict[int, list[tuple[int, tuple[int, int]]]]:
    """One rank's tasks seen from each student block: the (step, rows) it trains, in order, after checking
    that every task loads its input from the data set and runs the teacher up to the block it trains."""
    trained: dict[int, list[tuple[int, tuple[int, int]]]] = {block: [] for block in range(4)}
    for task in rank_tasks(plan_for(mode, 1, stages), 0, 5, [0] * 4, None):
        assert task.loads_data and task.teacher.start == 0 and not task.send and task.group is None
        for block in task.train:
            assert block < task.teacher.stop, f"{mode}: block {block} trained without its teacher block's output"
            trained[block].append((task.step, task.rows))
    return trained


def test_on_one_rank_every_mode_trains_each_block_on_the_same_batches_in_the_same_order() -> None:
    """A block's update depends on its own weights and its input (the teacher's output, fixed by the data
    and the step), so on one rank modes can differ only in how blocks interleave: each block must see
    every step once, in order, on the whole batch. With that, tr_dpu's one-rank run against the plain
    loop (tests/ranks/test_equivalence.py) covers the other modes' one-rank runs."""
    reference = per_block("tr_dpu")
    assert reference == {block: [(step, (0, 10)) for step in range(5)] for block in range(4)}
    for mode in ("dp", "ls", "ir", "tr"):
        assert per_block(mode) == reference, mode
    assert per_block("hybrid", [StageSpec(start=0, stop=4, replicas=1)]) == reference
