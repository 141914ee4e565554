"""A rank of the finetune phase: the whole network trained end to end, by DDP or as one pipeline stage.

Every strategy trains on the same global batches (the engine's seeded batch order over the training
split) with the same SGD and learning-rate schedule, and the loss is scaled so that the gradient is
that of the whole batch's mean loss: a DDP rank weights its shard's mean by its share times the world
size (DDP then averages), a pipeline's micro-batches are equal and the schedule averages them.

Per step each rank writes one telemetry line (metrics/finetune/rank-<r>.jsonl): loss and train
accuracy of what it saw (the last stage, for pipelines), time in F, B or I and W, send, receive wait,
all-reduce, optimiser and idle, the step's timeline of micro-batch actions, memory, and how many
micro-batches' moved delta shares (moved.py) it has combined or computed. At the end of each
epoch every stage is checkpointed (checkpoints/finetune/block-<stage>/), and every `eval_every` epochs
rank 0 evaluates top-1 of the whole network from those checkpoints; `--resume` continues from the last
step every stage saved, with its optimiser state.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from pipebd_core.data.batches import labelled_batches
from pipebd_core.data.datasets import build_dataset
from pipebd_core.data.streams import shard_rows
from pipebd_core.documents.phases import FINETUNE
from pipebd_core.documents.telemetry import Action, EvalLine, FinetuneLine
from pipebd_core.finetune.moved import stage_shares
from pipebd_core.finetune.plan import TrainPlan
from pipebd_core.finetune.timeline import Segment, timeline
from pipebd_core.finetune.trained import load_trained
from pipebd_core.rank import checkpoint
from pipebd_core.rank.batchnorm import with_sync_batchnorm
from pipebd_core.rank.deferred import WeightGradients, defer_weight_gradients
from pipebd_core.rank.faults import FAULT_ENV, injected_fault_step
from pipebd_core.rank.learning_rate import learning_rate
from pipebd_core.rank.metrics import perplexity, top1_accuracy
from pipebd_core.rank.network import Network, build_network, finetune_view, teacher_network
from pipebd_core.rank.process import join_process_group, pick_device
from pipebd_core.rank.telemetry import TelemetryWriter, current_memory_bytes, peak_memory_bytes
from pipebd_core.rundir import RunDir
from pipebd_core.spec import Spec

TIMES = ("F", "B", "I", "W", "send", "recv_wait", "optim", "idle")  # seconds per step, adding up to it
Batch = tuple[int, torch.Tensor, torch.Tensor]


def kd_target(teacher: nn.Module, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The teacher's logits and the label in one tensor (a schedule splits one target tensor by rows): the
    label last along the class dimension, per sample or, for a language model, per token."""
    with torch.no_grad():
        logits = teacher(inputs)
    return torch.cat([logits, labels.unsqueeze(-1).to(logits.dtype)], dim=-1)


def as_rows(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits as (rows, classes) and labels as (rows,): a language model's tokens are its rows, so every
    loss is the mean over tokens (every sequence has the same length: a shard's mean weighs as its rows)."""
    return logits.flatten(0, -2), labels.flatten()


def make_loss(spec: Spec) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The mean loss of a batch of logits: cross-entropy to the labels, or the kd mixture."""
    tune = spec.finetune
    assert tune is not None
    if tune.loss == "ce":
        return lambda logits, labels: F.cross_entropy(*as_rows(logits, labels))
    alpha, temperature, divergence = tune.alpha, tune.temperature, DIVERGENCES[tune.divergence]

    def kd(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        logits, labels = as_rows(logits, target[..., -1].long())
        teacher = target[..., :-1].flatten(0, -2)
        soft = divergence(F.log_softmax(teacher / temperature, dim=1), F.log_softmax(logits / temperature, dim=1))
        return alpha * F.cross_entropy(logits, labels) + (1 - alpha) * temperature**2 * soft

    return kd


@dataclass
class StepResult:
    """What one training step of this rank measured: its segments and optimizer seconds (the line's
    `times`, with the idle rest), and the other fields of its telemetry line (None: not this rank's)."""

    segments: list[Segment]  # what the step computed and waited for, in perf_counter seconds
    optim_s: float
    timeline: list[Action]  # the segments (and DDP's all-reduce spans), from the step's start
    loss: float | None = None  # where the rank has the loss: DDP, a pipeline's last stage
    acc: float | None = None
    samples: int | None = None
    allreduce_span: float | None = None  # DDP
    w_calls: int | None = None  # a pipeline
    moved_combined: int | None = None  # a pipeline
    moved_computed: int | None = None


def accuracy(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """Top-1 of a batch (a language model's: of its next tokens)."""
    return float((logits.argmax(-1) == labels).float().mean())


def kl(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """KL(p || q) of rows of log-probabilities, the mean over the rows."""
    return F.kl_div(log_q, log_p, reduction="batchmean", log_target=True)


def jsd(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """The Jensen-Shannon divergence: (KL(p || m) + KL(q || m)) / 2 with m = (p + q) / 2."""
    log_m = torch.logsumexp(torch.stack((log_p, log_q)), dim=0) - math.log(2.0)
    return 0.5 * (kl(log_p, log_m) + kl(log_q, log_m))


# finetune.divergence: of the teacher's log-probabilities (first) and the student's (second)
DIVERGENCES: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "forward": kl,
    "reverse": lambda log_p, log_q: kl(log_q, log_p),
    "jsd": jsd,
}


def step_seed(seed: int, step: int, rank: int) -> int:
    """Dropout's randomness per step and rank, so a resumed run draws what an uninterrupted one did."""
    return (seed * 1_000_003 + step * 1009 + rank) % (2**31 - 1)


@dataclass
class Context:
    rank: int
    world: int
    spec: Spec  # the finetune view (finetune_view): train.* and data.batch_size are the finetune phase's
    full_spec: Spec  # the spec as submitted: what builds the network
    plan: TrainPlan
    run_dir: RunDir
    device: torch.device
    network: Network
    start_step: int
    teacher: nn.Module | None
    losses: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = field(init=False)

    def __post_init__(self) -> None:
        self.losses = make_loss(self.spec)

    def target(self, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return labels if self.teacher is None else kd_target(self.teacher, inputs, labels)

    def batches(self, rows: tuple[int, int]) -> Iterator[Batch]:
        steps = range(self.start_step, self.plan.steps.total)
        dataset = build_dataset(self.spec)
        return labelled_batches(self.spec, dataset, rows, steps, self.device, self.plan.steps.train)


class Trainer:
    """What every strategy shares: the optimiser, the step loop, telemetry, checkpoints and evaluation."""

    def __init__(self, ctx: Context, module: nn.Module, unit: int | None) -> None:
        self.ctx, self.module = ctx, module.to(ctx.device).train()
        self.unit = unit  # the checkpoint unit this rank writes (its stage, or 0 for DDP's rank 0), or None
        train = ctx.spec.train
        # a stage of parameter-free layers (one that takes a moved delta share can be) has nothing to update:
        # an empty placeholder keeps its optimiser, steps and checkpoints like every other stage's
        parameters = list(module.parameters()) or [nn.Parameter(torch.zeros(0, device=ctx.device))]
        self.optimizer = torch.optim.SGD(
            parameters, lr=train.lr, momentum=train.momentum, weight_decay=train.weight_decay
        )
        self.telemetry = TelemetryWriter(ctx.run_dir.metrics(ctx.rank, FINETUNE))
        self.eval_network: Network | None = None
        self.fault_step = injected_fault_step(ctx.rank)

    def restore(self, unit: int) -> None:
        if self.ctx.start_step == 0:
            return
        state = checkpoint.load_block(self.ctx.run_dir.finetune_checkpoints, unit, self.ctx.start_step)
        self.module.load_state_dict(state["module"])
        self.optimizer.load_state_dict(state["optimizer"])

    def run(self) -> None:
        ctx, total = self.ctx, self.ctx.plan.steps.total
        try:
            for done, step in enumerate(range(ctx.start_step, total), start=1):
                if step == self.fault_step:
                    raise RuntimeError(f"injected fault on rank {ctx.rank} at finetune step {step} ({FAULT_ENV})")
                torch.manual_seed(step_seed(ctx.spec.train.seed, step, ctx.rank))
                lr = learning_rate(ctx.spec, step, total)
                for group in self.optimizer.param_groups:
                    group["lr"] = lr
                started = time.perf_counter()
                result = self.step(step)
                self.record(step, result, started, done, total - ctx.start_step)
                self.epoch_end(step + 1)
        finally:
            self.telemetry.close()

    def step(self, step: int) -> StepResult:
        raise NotImplementedError

    def record(self, step: int, result: StepResult, started: float, done: int, total: int) -> None:
        elapsed = time.perf_counter() - started
        times = dict.fromkeys(TIMES, 0.0)
        for segment in result.segments:
            times[segment.kind] += segment.end - segment.start
        times["optim"] = result.optim_s
        times["idle"] = max(0.0, elapsed - sum(times.values()))
        memory = current_memory_bytes(self.ctx.device)
        line = FinetuneLine(
            time=time.time(),
            rank=self.ctx.rank,
            epoch=step // self.ctx.plan.steps.per_epoch,
            step=step,
            times=times,
            elapsed=elapsed,
            peak_mem=max(peak_memory_bytes(self.ctx.device), memory),
            cur_mem=memory,
            done=done,
            total=total,
            skipped=self.ctx.start_step,
            samples=result.samples,
            loss=result.loss,
            acc=result.acc,
            timeline=result.timeline,
            allreduce_span=result.allreduce_span,
            w_calls=result.w_calls,
            moved_combined=result.moved_combined,
            moved_computed=result.moved_computed,
        )
        self.telemetry.write(line)

    def epoch_end(self, step_done: int) -> None:
        """Checkpoint at each epoch's end (and the last step); evaluate every `eval_every` epochs."""
        ctx = self.ctx
        per_epoch, total = ctx.plan.steps.per_epoch, ctx.plan.steps.total
        if step_done % per_epoch and step_done != total:
            return
        if self.unit is not None:
            state = {"module": self.module.state_dict(), "optimizer": self.optimizer.state_dict()}
            checkpoint.save_block(ctx.run_dir.finetune_checkpoints, self.unit, step_done, state, len(ctx.plan.stages))
            ctx.run_dir.append_event("checkpoint", phase=FINETUNE, rank=ctx.rank, step=step_done)
        epoch = -(-step_done // per_epoch)
        assert ctx.spec.finetune is not None
        if epoch % ctx.spec.finetune.eval_every and step_done != total:
            return
        if dist.is_initialized():
            dist.barrier()  # every stage's checkpoint of this step is on disk
        if ctx.rank == 0:
            self.evaluate(step_done, epoch)

    def evaluate(self, step_done: int, epoch: int) -> None:
        ctx = self.ctx
        if self.eval_network is None:
            self.eval_network = build_network(ctx.full_spec, ctx.run_dir)
        load_trained(self.eval_network, ctx.run_dir, ctx.plan, step_done)
        model, language = self.eval_network.model, ctx.spec.workload.language_model
        quality = {"perplexity": perplexity(model, ctx.spec, ctx.device)} if language else {}
        top1 = None if language else top1_accuracy(model, ctx.spec, ctx.device)
        line = EvalLine(time=time.time(), rank=ctx.rank, epoch=epoch, step=step_done - 1, top1=top1, **quality)
        self.telemetry.write(line)
        self.module.train()


class DDPTrainer(Trainer):
    """The whole network on every rank; each loads its shard of the batch; DDP all-reduces gradients.
    BatchNorm layers normalise over the whole batch (the cross-rank BatchNorm, or SyncBatchNorm on GPUs,
    in a group of their own so their exchanges never interleave with DDP's buckets), so ddp trains what
    full-batch training trains."""

    def __init__(self, ctx: Context) -> None:
        module: nn.Module = ctx.network.sequential()
        if ctx.world > 1:
            norms = dist.new_group(list(range(ctx.world)))
            assert isinstance(norms, dist.ProcessGroup), "every rank is a member of the world's group"
            module = with_sync_batchnorm(module, norms, ctx.device)
        super().__init__(ctx, module, 0 if ctx.rank == 0 else None)
        self.restore(0)
        self.rows = shard_rows(ctx.plan.batch_size, ctx.world)[ctx.rank]
        self.scale = (self.rows[1] - self.rows[0]) / ctx.plan.batch_size * ctx.world
        self.reduce_spans: list[Segment] = []
        self.model: nn.Module = self.module
        if ctx.world > 1:
            self.model = DistributedDataParallel(self.module, broadcast_buffers=False)
            self.model.register_comm_hook(self.reduce_spans, timed_all_reduce)
        self.loader = ctx.batches(self.rows)

    def step(self, step: int) -> StepResult:
        key, inputs, labels = next(self.loader)
        assert key == step, f"the loader is at step {key}, the trainer at {step}"
        self.reduce_spans.clear()
        start = time.perf_counter()
        logits = self.model(inputs)
        loss = self.ctx.losses(logits, self.ctx.target(inputs, labels))
        forward_end = time.perf_counter()
        (loss * self.scale).backward()
        backward_end = time.perf_counter()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        optim_end = time.perf_counter()
        segments = [Segment("F", 0, start, forward_end), Segment("B", 0, forward_end, backward_end)]
        spans = self.reduce_spans
        return StepResult(
            segments=segments,
            optim_s=optim_end - backward_end,
            timeline=timeline(segments + spans, start),
            loss=float(loss),
            acc=accuracy(logits, labels),
            samples=len(labels),
            # the gradient buckets' all-reduce runs during the backward (B waits for its end): its span
            allreduce_span=(max(s.end for s in spans) - min(s.start for s in spans)) if spans else 0.0,
        )


def timed_all_reduce(spans, bucket):
    """DDP's average of one gradient bucket, recording when it started and when it was done. (DDP reads
    this hook's annotations and refuses any but its own classes, which postponed annotations are not.)"""
    started = time.perf_counter()
    tensor = bucket.buffer().div_(dist.get_world_size())
    future = dist.all_reduce(tensor, async_op=True).get_future()

    def done(result: torch.futures.Future[Any]) -> torch.Tensor:
        spans.append(Segment("allreduce", None, started, time.perf_counter()))
        value: torch.Tensor = result.value()[0]
        return value

    return future.then(done)


class PipelineTrainer(Trainer):
    """One stage of contiguous layers; the schedule runs the plan's actions over equal micro-batches."""

    def __init__(self, ctx: Context) -> None:
        start, stop = ctx.plan.stage_of(ctx.rank)
        super().__init__(ctx, ctx.network.sequential(start, stop), ctx.rank)
        self.restore(ctx.rank)
        self.first, self.last = ctx.rank == 0, ctx.rank == ctx.world - 1
        self.weights: WeightGradients | None = (
            defer_weight_gradients(self.module) if ctx.plan.strategy == "zb" else None
        )
        self.shares = stage_shares(ctx.plan, ctx.rank, ctx.network.layers, ctx.device, self.weights)
        # imported here: a DDP rank never needs torch.distributed.pipelining; the warm agent imports it
        # before forking a pipeline's ranks (__main__.py's preload)
        from pipebd_core.finetune.pipeline import make_schedule, make_stage

        self.stage = make_stage(ctx.plan, ctx.rank, self.module, ctx.device, self.weights, self.shares)
        self.schedule = make_schedule(ctx.plan, self.stage, ctx.losses)
        loads = self.first or self.last
        self.loader = ctx.batches((0, ctx.plan.batch_size)) if loads else None

    def step(self, step: int) -> StepResult:
        stage, inputs, labels = self.stage, None, None
        if self.loader is not None:
            key, inputs, labels = next(self.loader)
            assert key == step, f"the loader is at step {key}, the trainer at {step}"
        stage.segments.clear()
        start = time.perf_counter()
        losses: list[torch.Tensor] = []
        args = (inputs,) if self.first else ()
        target = None
        if self.last:
            assert inputs is not None and labels is not None
            target = self.ctx.target(inputs, labels)
        from pipebd_core.finetune.pipeline import timed_waits

        with timed_waits(stage):
            output = self.schedule.step(*args, target=target, losses=losses) if self.last else self.schedule.step(*args)
        if self.weights is not None:
            self.weights.run()  # nothing is left once every W ran; kept for schedules that end on an I
        optim_start = time.perf_counter()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        optim_s = time.perf_counter() - optim_start
        # micro-batches so far whose moved delta share this rank combined (as the owner of the boundary
        # layer) and computed (as the next stage): how the tests see that a move ran
        gives, takes = self.shares
        result = StepResult(
            segments=list(stage.segments),
            optim_s=optim_s,
            timeline=timeline(stage.segments, start),
            w_calls=self.weights.calls if self.weights is not None else 0,
            moved_combined=gives.combined if gives is not None else 0,
            moved_computed=takes.computed if takes is not None else 0,
        )
        if self.last:
            assert labels is not None
            result.loss = float(torch.stack(losses).detach().mean())
            result.acc = accuracy(output, labels)
            result.samples = len(labels)
        return result


def build_context(run_dir: RunDir, rank: int, world: int, device: torch.device) -> Context:
    spec = run_dir.load_spec()
    plan = TrainPlan.from_document(run_dir.load_finetune_plan())
    starts = run_dir.finetune_checkpoints.resume_steps(len(plan.stages), common=True)
    teacher = teacher_network(spec) if spec.finetune is not None and spec.finetune.loss == "kd" else None
    return Context(
        rank=rank,
        world=world,
        spec=finetune_view(spec),
        full_spec=spec,
        plan=plan,
        run_dir=run_dir,
        device=device,
        network=build_network(spec, run_dir),
        start_step=starts[0],
        teacher=teacher.to(device) if teacher is not None else None,
    )


def run_rank(run_dir: RunDir) -> None:
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    spec = run_dir.load_spec()
    device = pick_device(spec, int(os.environ.get("LOCAL_RANK", "0")))
    pipelined = TrainPlan.from_document(run_dir.load_finetune_plan()).pipelined
    join_process_group(spec, device, world, alone_too=pipelined)
    ctx = build_context(run_dir, rank, world, device)
    plan = ctx.plan
    role = f"layers {plan.stage_of(rank)}" if plan.pipelined else f"rows {shard_rows(plan.batch_size, world)[rank]}"
    print(f"pipebd: finetune rank {rank} of {world} on {device}: {ctx.plan.strategy}, {role}", flush=True)
    run_dir.append_event("rank_started", phase=FINETUNE, rank=rank, start_step=ctx.start_step)
    trainer: Trainer = PipelineTrainer(ctx) if ctx.plan.pipelined else DDPTrainer(ctx)
    trainer.run()
    run_dir.append_event("rank_finished", phase=FINETUNE, rank=rank)
    if dist.is_initialized():
        dist.destroy_process_group()
