"""Each mode's per-rank order of work, written as pure generators of tasks.

A task is one optimiser step of some student blocks on some rows of one global batch: take the
activation entering `teacher.start` (loaded from the data set or received from other ranks), run
teacher blocks `teacher`, send the result on, train the students in `train`, combine gradients in
`group` and update. The runtime executes these tasks; the simulator replays them. Example with
4 blocks, 2 ranks, steps s0, s1 (T = teacher work, S = student work, -> = send):

    tr_dpu   rank 0 | T0 T1 ->s0 | S0 S1 s0 | T0 T1 ->s1 | S0 S1 s1 |
             rank 1 |   (wait s0)            | T2 T3 S2 S3 s0 | T2 T3 S2 S3 s1 |
    dp       rank r | T0 S0 s0 | T0 S0 s1 | ... | T0 T1 S1 s0 | ... | T0 T1 T2 T3 S3 s1 |  (half batch)
    ls       rank 0 | T0 S0 s0 | T0 S0 s1 | T0 T1 T2 S2 s0 | ...                         (full batch)
    ir       rank r | T0 T1 T2 T3 S0 S1 S2 S3 s0 | ...                                    (half batch)
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

from pipebd_core.data.streams import SearchSchedule, shard_rows
from pipebd_core.distill.plan import Plan, Route

WORLD = -1  # gradient group id meaning "all ranks"


@dataclass(frozen=True)
class Task:
    step: int  # global optimiser step, counted across epochs
    teacher: range  # teacher blocks run on this task's input
    train: tuple[int, ...]  # student blocks updated by this task
    rows: tuple[int, int]  # rows [start, stop) of the global batch
    receive: tuple[Route, ...]  # empty: the input is loaded from the data set
    send: tuple[Route, ...]  # where the output of the last teacher block goes
    group: int | None  # gradient group: None (alone), WORLD, or a stage index
    barrier: bool  # wait for every rank before the update (tr)
    round: str = "weights"  # "arch": a nas architecture update on a held-out batch, after the weight round
    last_of_step: bool = True  # no other round of this step follows (checkpoints wait for it)

    @property
    def loads_data(self) -> bool:
        return not self.receive


def arch_update_index(step: int, search: SearchSchedule | None) -> int | None:
    """Which architecture update step `step` ends with, or None: every `every` steps from `from_step`."""
    if search is None or step < search.from_step:
        return None
    done = step + 1 - search.from_step
    return done // search.every - 1 if done % search.every == 0 else None


def with_arch_rounds(tasks: Iterator[Task], search: SearchSchedule | None) -> Iterator[Task]:
    """After each weight task of a step that updates the architecture, the same task in the arch round."""
    for task in tasks:
        if arch_update_index(task.step, search) is None:
            yield task
        else:
            yield replace(task, last_of_step=False)
            yield replace(task, round="arch")


def rank_tasks(
    plan: Plan, rank: int, total_steps: int, start_steps: list[int], search: SearchSchedule | None
) -> Iterator[Task]:
    """The tasks `rank` runs, in order; `start_steps[b]` is the first step block b still needs, `search`
    when architecture updates follow weight steps (nas)."""
    if plan.mode == "dp":
        tasks = _data_parallel(plan, rank, total_steps, start_steps)
    elif plan.mode == "ls":
        tasks = _layerwise(plan, rank, total_steps, start_steps)
    else:
        tasks = _pipeline(plan, rank, total_steps, start_steps)
    yield from with_arch_rounds(tasks, search)


def _data_parallel(plan: Plan, rank: int, total_steps: int, start_steps: list[int]) -> Iterator[Task]:
    rows = shard_rows(plan.batch_size, plan.nproc)[rank]
    group = WORLD if plan.nproc > 1 else None
    for block in range(plan.num_blocks):
        for step in range(start_steps[block], total_steps):
            yield Task(step, range(0, block + 1), (block,), rows, (), (), group, False)


def _layerwise(plan: Plan, rank: int, total_steps: int, start_steps: list[int]) -> Iterator[Task]:
    rows = (0, plan.batch_size)
    for block in plan.assignment[rank]:
        for step in range(start_steps[block], total_steps):
            yield Task(step, range(0, block + 1), (block,), rows, (), (), None, False)


def _pipeline(plan: Plan, rank: int, total_steps: int, start_steps: list[int]) -> Iterator[Task]:
    stage = plan.stage_of(rank)
    group = plan.stages.index(stage) if stage.replicas > 1 else None
    receive = tuple(plan.routes_into(rank))
    send = tuple(plan.routes_out_of(rank))
    first_step = min(start_steps[block] for block in stage.blocks)
    barrier = plan.mode == "tr"
    for step in range(first_step, total_steps):
        yield Task(step, stage.blocks, tuple(stage.blocks), stage.rows_of(rank), receive, send, group, barrier)


def count_tasks(plan: Plan, rank: int, total_steps: int, start_steps: list[int], search: SearchSchedule | None) -> int:
    """How many tasks `rank_tasks` yields."""
    return sum(1 for _ in rank_tasks(plan, rank, total_steps, start_steps, search))
