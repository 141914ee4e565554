"""The per-rank runtime: executes a rank's tasks (see schedule.py) with one shared step.

Every mode runs through `Trainer.run_task`: obtain the input rows (load or receive), run the
teacher blocks, send the last activation on at once, train the students against the teacher's
outputs, combine gradients where the rows were split, optionally wait at a barrier, update.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import chain
from typing import Any

import torch
import torch.distributed as dist

from pipebd_core.data.batches import BatchLoader
from pipebd_core.data.streams import StepPlan
from pipebd_core.distill.comm import PendingReceive, Relay, make_groups, resolve_group
from pipebd_core.distill.control import StopWatch, mark_stopped
from pipebd_core.distill.plan import Plan
from pipebd_core.distill.schedule import WORLD, Task, arch_update_index, count_tasks, rank_tasks
from pipebd_core.documents.telemetry import BlockSeconds, DistillLine
from pipebd_core.rank import checkpoint
from pipebd_core.rank.batchnorm import with_sync_batchnorm
from pipebd_core.rank.faults import FAULT_ENV, injected_fault_step
from pipebd_core.rank.learning_rate import learning_rate
from pipebd_core.rank.students import StudentBlock
from pipebd_core.rank.telemetry import (
    PhaseClock,
    TelemetryWriter,
    UtilizationSampler,
    current_memory_bytes,
    nvml_utilization_reader,
    peak_memory_bytes,
)
from pipebd_core.rundir import RunDir
from pipebd_core.spec import Spec
from pipebd_core.workloads.workload import Workload


@dataclass
class RankContext:
    """Everything a rank needs, resolved once at start-up."""

    rank: int
    spec: Spec
    plan: Plan
    run_dir: RunDir
    workload: Workload
    dataset: Any  # a torch Dataset, or None on ranks that only receive
    device: torch.device
    steps: StepPlan  # step counts, the sample ranges each round's batches come from, architecture updates
    start_steps: list[int]  # per block: the first step still to run (resume)

    @property
    def total_steps(self) -> int:
        return self.steps.total

    @property
    def steps_per_epoch(self) -> int:
        return self.steps.per_epoch


def with_next(tasks: Iterator[Task]) -> Iterator[tuple[Task, Task | None]]:
    """Pairs (task, the task after it) so the next receive can be posted early."""
    current = next(tasks, None)
    while current is not None:
        following = next(tasks, None)
        yield current, following
        current = following


class Trainer:
    """Owns one rank's blocks, optimisers, gradient buffers, relay and telemetry."""

    def __init__(self, ctx: RankContext) -> None:
        self.ctx = ctx
        spec, plan, workload = ctx.spec, ctx.plan, ctx.workload
        self.tasks = list(rank_tasks(plan, ctx.rank, ctx.total_steps, ctx.start_steps, ctx.steps.search))
        everything = count_tasks(plan, ctx.rank, ctx.total_steps, [0] * plan.num_blocks, ctx.steps.search)
        self.skipped = everything - len(self.tasks)  # done before a resume: progress counts them as done
        teacher_blocks = sorted(set(chain.from_iterable(task.teacher for task in self.tasks)))
        trained_blocks = sorted(set(chain.from_iterable(task.train for task in self.tasks)))
        self.teachers = {b: workload.teacher_blocks[b].to(ctx.device) for b in teacher_blocks}
        relay_group, self.stage_groups = make_groups(plan)
        groups = {block: resolve_group(task, self.stage_groups) for task in self.tasks for block in task.train}
        self.students = {}
        for b in trained_blocks:
            module = with_sync_batchnorm(workload.student_blocks[b], groups[b], ctx.device)
            self.students[b] = StudentBlock(b, module, workload.loss_of(b), spec, workload.search, ctx.device)
        self._restore()
        shapes = [tuple(shape) for shape in plan.shapes]
        self.relay = Relay(relay_group, shapes, ctx.device)
        self.clock = PhaseClock(ctx.device)
        self.telemetry = TelemetryWriter(ctx.run_dir.metrics(ctx.rank))
        self.gpu_util = UtilizationSampler(nvml_utilization_reader(ctx.device))  # no reader on CPU
        self.batches = {round_: self._batches(round_) for round_ in ("weights", "arch")}
        self.last_loss: dict[int, float] = {}
        self.fault_step = injected_fault_step(ctx.rank)
        self.stop = StopWatch(ctx.run_dir, plan, ctx.rank, self.tasks)
        self.reached = {block: ctx.start_steps[block] for block in trained_blocks}  # steps each block has done
        self.owned = {block for task in self.tasks for block in task.train if self._owns_update(task)}

    def _restore(self) -> None:
        folder = self.ctx.run_dir.checkpoints
        for block, student in self.students.items():
            step = self.ctx.start_steps[block]
            if step > 0:
                student.load(checkpoint.load_block(folder, block, step))

    def _batches(self, round_: str) -> Iterator[tuple[int, torch.Tensor]]:
        """Input rows of this rank's loading tasks of one round, prefetched in task order."""
        loading = [task for task in self.tasks if task.loads_data and task.round == round_]
        if not loading:
            return iter(())
        rows = loading[0].rows
        assert all(task.rows == rows for task in loading), "a rank loads one row range in every task"
        keys = [self._batch_key(task) for task in loading]
        stream = self.ctx.steps.stream(round_)
        return iter(BatchLoader(self.ctx.spec, self.ctx.dataset, rows, keys, self.ctx.device, stream))

    def _batch_key(self, task: Task) -> int:
        """Which batch of its stream a task trains on: the step, or the architecture update's index."""
        if task.round == "weights":
            return task.step
        index = arch_update_index(task.step, self.ctx.steps.search)
        assert index is not None, f"step {task.step} has no architecture update"
        return index

    def run(self) -> bool:
        """Run every task, or stop at a step boundary when asked (control.py); True when it stopped."""
        total = len(self.tasks)
        pending: PendingReceive | None = None
        if self.tasks and self.tasks[0].receive and not self.stop.before(0, self.tasks[0].step):
            pending = self.relay.post_receive(self.tasks[0])
        stopped = False
        try:
            for index, (task, following) in enumerate(with_next(iter(self.tasks))):
                if self.stop.before(index, task.step):
                    stopped = True
                    break
                pending = self.run_task(task, following, pending, index + 1, total)
            self.relay.drain()
            if stopped:
                self._save_reached()
        finally:
            self.telemetry.close()
        return stopped

    def run_task(
        self, task: Task, following: Task | None, pending: PendingReceive | None, done: int, total: int
    ) -> PendingReceive | None:
        """One optimiser step of `task.train`; returns the receive already posted for `following`."""
        if task.step == self.fault_step and task.round == "weights":
            raise RuntimeError(f"injected fault on rank {self.ctx.rank} at step {task.step} ({FAULT_ENV})")
        self.clock.start()
        inputs = self._obtain_input(task, pending)
        receive_next = following is not None and following.receive and not self.stop.before(done, following.step)
        pending_next = self.relay.post_receive(following) if following and receive_next else None
        activations = self._teacher_forward(task, inputs)
        self.relay.send(task, activations[-1])
        self.clock.mark("send")
        losses = self._train_students(task, activations)
        if task.barrier and dist.is_initialized():
            dist.barrier()
        self.clock.mark("barrier")
        lr = learning_rate(self.ctx.spec, task.step, self.ctx.total_steps)
        for block in task.train:
            self.students[block].update(task.round, lr)
            self.clock.mark("optim")
            if task.last_of_step:
                self.reached[block] = task.step + 1
        self._record(task, losses, done, total)
        self._checkpoint(task)
        return pending_next

    def _obtain_input(self, task: Task, pending: PendingReceive | None) -> torch.Tensor:
        if task.loads_data:
            key, inputs = next(self.batches[task.round])
            assert key == self._batch_key(task), f"data loader is at batch {key}, task wants {task}"
            self.clock.mark("data")
            return inputs
        assert pending is not None and pending.key == (task.step, task.round), "receive was not posted for this task"
        inputs = self.relay.wait(pending)
        self.clock.mark("recv_wait")
        return inputs

    def _teacher_forward(self, task: Task, inputs: torch.Tensor) -> list[torch.Tensor]:
        activations = [inputs]
        with torch.no_grad():
            for block in task.teacher:
                activations.append(self.teachers[block](activations[-1]))
                self.clock.mark("teacher")  # once per block: the record keeps each block's time
        return activations

    def _train_students(self, task: Task, activations: list[torch.Tensor]) -> dict[int, float]:
        """Backward each block separately and start its all-reduce at once, overlapping the next backward."""
        group = resolve_group(task, self.stage_groups)
        share = (task.rows[1] - task.rows[0]) / self.ctx.plan.batch_size
        losses, handles = {}, []
        for block in task.train:
            student, position = self.students[block], block - task.teacher.start
            student.begin(task.step, task.round)
            loss = student.loss(activations[position], activations[position + 1])
            (loss * share).backward()  # shard-weighted, so summed gradients equal the full batch's
            losses[block] = loss.detach()
            handles.append(student.start_all_reduce(task.round, group))
            self.clock.mark("student")
        for handle in handles:
            if handle is not None:
                handle.wait()
        self.clock.mark("allreduce")
        return {block: float(loss) for block, loss in losses.items()}

    def _record(self, task: Task, losses: dict[int, float], done: int, total: int) -> None:
        memory = current_memory_bytes(self.ctx.device)
        # the kernel's peak RSS lags the current RSS by a few pages: a peak is never below the present
        peak = max(peak_memory_bytes(self.ctx.device), memory)
        paths = {block: drawn for block in task.train if (drawn := self.students[block].sampled()) is not None}
        self.telemetry.write(
            DistillLine(
                time=time.time(),
                rank=self.ctx.rank,
                epoch=task.step // self.ctx.steps_per_epoch,
                step=task.step,
                round=task.round,
                blocks=list(task.train),
                loss=losses,
                phases=self.clock.phases(),
                block_s=self._block_times(task),
                samples=task.rows[1] - task.rows[0],
                peak_mem=peak,
                cur_mem=memory,
                done=done,
                total=total,
                skipped=self.skipped,
                paths=paths or None,  # NAS: the candidates each layer drew this step (identical on every replica)
                gpu_util=self.gpu_util.sample(),
                arch={block: self.students[block].probabilities() for block in task.train}
                if task.round != "weights"
                else None,
            )
        )
        if task.round == "weights":
            self.last_loss.update(losses)

    def _block_times(self, task: Task) -> BlockSeconds:
        """Each block's teacher forward and student step (forward, backward, update) this task, as profiled."""
        teacher = dict(zip(task.teacher, self.clock.laps("teacher"), strict=True))
        student = self.clock.laps("student")
        update = self.clock.laps("optim")
        return BlockSeconds(
            teacher=teacher, student={block: student[i] + update[i] for i, block in enumerate(task.train)}
        )

    def _save_reached(self) -> None:
        """On a stop: checkpoint every block this rank owns at the step it reached (unless already saved)."""
        saved, folder = [], self.ctx.run_dir.checkpoints
        for block in sorted(self.owned):
            step = self.reached[block]
            if step > self.ctx.start_steps[block] and step not in folder.saved_steps(block):
                self._save(block, step)
                saved.append(block)
        reached = {str(block): self.reached[block] for block in sorted(self.owned)}
        self.ctx.run_dir.append_event("rank_stopped", rank=self.ctx.rank, reached=reached, saved=saved)
        mark_stopped(self.ctx.run_dir, self.ctx.rank)

    def _checkpoint(self, task: Task) -> None:
        step_done = task.step + 1
        spec = self.ctx.spec
        if not task.last_of_step:
            return
        if not checkpoint.should_checkpoint(
            step_done, self.ctx.steps_per_epoch, self.ctx.total_steps, spec.train.checkpoint_every
        ):
            return
        # the telemetry of every step a checkpoint holds is on disk before it (on every rank of the group):
        # a run resumed from it after a kill redoes only steps whose lines may have been lost
        self.telemetry.flush()
        if not self._owns_update(task):
            return
        for block in task.train:
            self._save(block, step_done)
        self.ctx.run_dir.append_event("checkpoint", rank=self.ctx.rank, blocks=list(task.train), step=step_done)

    def _save(self, block: int, step_done: int) -> None:
        common = self.ctx.plan.num_blocks if self.ctx.plan.is_pipeline else None  # see resume_steps
        state = {**self.students[block].state(), "loss": self.last_loss.get(block)}
        checkpoint.save_block(self.ctx.run_dir.checkpoints, block, step_done, state, common)

    def _owns_update(self, task: Task) -> bool:
        """The lowest rank of a gradient group writes the group's checkpoint."""
        if task.group is None:
            return True
        if task.group == WORLD:
            return self.ctx.rank == 0
        return self.ctx.plan.stages[task.group].ranks[0] == self.ctx.rank
