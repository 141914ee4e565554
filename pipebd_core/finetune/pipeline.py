"""One pipeline stage per rank on torch.distributed.pipelining, timed action by action.

`TimedStage` is a `PipelineStage` that records every compute action it runs (F, B, I, W with its
micro-batch, start and end), and every wait on a send or a receive, as `Segment`s of the current step.
Waits happen inside the schedules' private `_wait_batch_p2p`; `timed_waits()` wraps it for the life of a
rank (it is the only way to see a receive wait without re-implementing the schedules). `make_schedule`
builds the strategy's schedule: torch's ScheduleGPipe and Schedule1F1B, or, for zb, its action runtime
fed the plan's own per-rank lists (schedules.py), with weight gradients from deferred.py.

A stage whose boundary layer gives a share of its delta to the next stage (`gives`), or that takes one
from the previous stage (`takes`), adds that share's traffic to its own sends and receives (moved.py):
the weight slice travels with micro-batch 0's activation, each micro-batch's partial input gradient
with its output gradient. The schedules batch a stage's operations per peer in the order the stage lists
them, and both ends list them in the same order, so the extra tensors pair up as the stage's own do.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.distributed.pipelining import schedules as torch_schedules

from pipebd_core.finetune.moved import GivenShare, TakenShare, recv, send
from pipebd_core.finetune.plan import TrainPlan
from pipebd_core.finetune.timeline import Segment
from pipebd_core.rank.deferred import WeightGradients


class TimedStage(PipelineStage):
    """A stage that keeps a timeline of what it computed and waited for during the current step. With
    `weights` (zb), only its real backward passes keep inputs for the deferred weight gradients: the
    stage's own shape inference runs a backward on dummy tensors that must not count. With `gives` or
    `takes`, it moves a share of a boundary layer's delta (see the module's docstring)."""

    def __init__(
        self,
        *args: Any,
        weights: WeightGradients | None = None,
        gives: GivenShare | None = None,
        takes: TakenShare | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.weights = weights
        if weights is not None:
            weights.switch.on = False
        self.gives, self.takes = gives, takes
        self.slice_sent: torch.Tensor | None = None  # alive until its send is waited for
        self.segments: list[Segment] = []
        self.waiting_for = "recv_wait"  # what the next wait is for: a receive, or sends to finish

    def _timed(self, kind: str, microbatch: int, run: Callable[[], Any]) -> Any:
        start = time.perf_counter()
        try:
            return run()
        finally:
            self.segments.append(Segment(kind, microbatch, start, time.perf_counter()))

    def forward_one_chunk(self, fwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        return self._timed(
            "F", fwd_chunk_id, lambda: super(TimedStage, self).forward_one_chunk(fwd_chunk_id, *args, **kwargs)
        )

    def backward_one_chunk(
        self, bwd_chunk_id: int, loss: Any = None, full_backward: bool = True, last_backward: bool = False
    ) -> None:
        def run() -> None:
            if self.gives is not None:
                self.gives.current = bwd_chunk_id
            try:
                with self.weights.keeping() if self.weights is not None else contextlib.nullcontext():
                    super(TimedStage, self).backward_one_chunk(bwd_chunk_id, loss, full_backward, last_backward)
            finally:
                if self.gives is not None:
                    self.gives.current = None
            if self.takes is not None:
                (grad,) = self.bwd_cache[bwd_chunk_id]
                assert grad is not None, "a stage that takes a moved share has an input gradient"
                self.takes.compute(bwd_chunk_id, grad)

        self._timed("B" if full_backward else "I", bwd_chunk_id, run)

    def backward_weight_one_chunk(self, bwd_chunk_id: int, last_backward: bool = False) -> None:
        self._timed(
            "W", bwd_chunk_id, lambda: super(TimedStage, self).backward_weight_one_chunk(bwd_chunk_id, last_backward)
        )

    def get_fwd_recv_ops(self, fwd_chunk_id: int) -> list[dist.P2POp]:
        self.waiting_for = "recv_wait"
        ops = super().get_fwd_recv_ops(fwd_chunk_id)
        if self.takes is not None and fwd_chunk_id == 0:
            ops.append(recv(self.takes.weight, self.peer(-1), self._downstream_group))
        return ops

    def get_bwd_recv_ops(self, bwd_chunk_id: int) -> list[dist.P2POp]:
        self.waiting_for = "recv_wait"
        ops = super().get_bwd_recv_ops(bwd_chunk_id)
        if self.gives is not None:
            ops.append(recv(self.gives.buffer(bwd_chunk_id), self.peer(+1), self._upstream_group))
        return ops

    def get_fwd_send_ops(self, fwd_chunk_id: int) -> list[dist.P2POp]:
        self.waiting_for = "send"
        ops = super().get_fwd_send_ops(fwd_chunk_id)
        if self.gives is not None and fwd_chunk_id == 0:
            self.slice_sent = self.gives.weight_slice()
            ops.append(send(self.slice_sent, self.peer(+1), self._downstream_group))
        return ops

    def get_bwd_send_ops(self, bwd_chunk_id: int) -> list[dist.P2POp]:
        self.waiting_for = "send"
        ops = super().get_bwd_send_ops(bwd_chunk_id)
        if self.takes is not None:
            ops.append(send(self.takes.partials.pop(bwd_chunk_id), self.peer(-1), self._upstream_group))
        return ops

    def peer(self, offset: int) -> int:
        """The global rank of the stage `offset` away from this one."""
        return self._resolve_peer_global_rank(self.stage_index + offset)


@contextlib.contextmanager
def timed_waits(stage: TimedStage) -> Iterator[None]:
    """Record every wait of the schedules on sends and receives as a segment of `stage`."""
    original = torch_schedules._wait_batch_p2p

    def wait(work: Any) -> None:
        start = time.perf_counter()
        original(work)
        if work:
            stage.segments.append(Segment(stage.waiting_for, None, start, time.perf_counter()))

    torch_schedules._wait_batch_p2p = wait
    try:
        yield
    finally:
        torch_schedules._wait_batch_p2p = original


def make_stage(
    plan: TrainPlan,
    rank: int,
    module: nn.Module,
    device: torch.device,
    weights: WeightGradients | None,
    shares: tuple[GivenShare | None, TakenShare | None] = (None, None),
) -> TimedStage:
    """This rank's stage, with a static example input of one micro-batch (every step has the same shapes)."""
    start, _ = plan.stage_of(rank)
    example = plan.example_input(start, plan.microbatch_size, device)
    dw_builder = (lambda: weights.run) if weights is not None else None
    gives, takes = shares
    return TimedStage(
        module,
        rank,
        plan.nproc,
        device,
        input_args=(example,),
        dw_builder=dw_builder,
        weights=weights,
        gives=gives,
        takes=takes,
    )


def make_schedule(plan: TrainPlan, stage: TimedStage, loss_fn: Callable[..., torch.Tensor]) -> Any:
    """The schedule that runs `plan.strategy` on this rank's stage."""
    if plan.strategy == "gpipe":
        return ScheduleGPipe(stage, plan.microbatches, loss_fn=loss_fn)
    if plan.strategy == "1f1b":
        return Schedule1F1B(stage, plan.microbatches, loss_fn=loss_fn)
    assert plan.strategy == "zb", f"{plan.strategy!r} is not a pipelined strategy"
    schedule = torch_schedules._PipelineScheduleRuntime([stage], plan.microbatches, loss_fn=loss_fn)
    kinds = {"F": torch_schedules.F, "I": torch_schedules.I, "W": torch_schedules.W, "B": torch_schedules.B}
    orders = {
        rank: [torch_schedules._Action(rank, kinds[a.kind], a.microbatch) for a in actions]
        for rank, actions in enumerate(plan.actions)
    }
    schedule._prepare_schedule_with_comms(orders)  # type: ignore[arg-type]
    return schedule
