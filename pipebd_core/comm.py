"""Communication: process groups, teacher-activation relaying, and gradient combination.

Relaying is point-to-point on a process group of its own, so it never interleaves with the
collectives (barriers, all-reduces). The receive for step t+1 is posted before step t is computed,
and sends are not waited on each step: at most `max_in_flight` steps of sends stay outstanding,
which bounds memory while letting a producer run ahead of its consumers.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from pipebd_core.plan import Plan, Route
from pipebd_core.schedule import WORLD, Task

Handle = dist.Work
SEND_WINDOW = 2  # steps of sends a producer may have outstanding before it waits


def make_groups(plan: Plan) -> tuple[dist.ProcessGroup | None, dict[int, dist.ProcessGroup]]:
    """Create, on every rank and in the same order, the relay group and one group per replicated stage."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return None, {}
    relay = _new_group(list(range(plan.nproc)))
    stage_groups = {}
    for index, stage in enumerate(plan.stages):
        if stage.replicas > 1:
            group = _new_group(list(stage.ranks))  # every rank must call new_group, members or not
            if group is not None:
                stage_groups[index] = group
    return relay, stage_groups


def _new_group(ranks: list[int]) -> dist.ProcessGroup | None:
    """The new group, or None on ranks outside it."""
    group = dist.new_group(ranks=ranks)
    return group if isinstance(group, dist.ProcessGroup) else None


@dataclass
class PendingReceive:
    """Receives posted for one task: a buffer for its input rows and the handles filling it."""

    step: int
    buffer: torch.Tensor
    handles: list[Handle]


class Relay:
    """Posts receives ahead of time and keeps a bounded window of outstanding sends."""

    def __init__(
        self,
        group: dist.ProcessGroup | None,
        shapes: list[tuple[int, ...]],
        device: torch.device,
        max_in_flight: int = SEND_WINDOW,
    ) -> None:
        self.group = group
        self.shapes = shapes  # per-sample shape of x_0 .. x_B
        self.device = device
        self.max_in_flight = max_in_flight
        self._sends: deque[tuple[int, list[Handle], list[torch.Tensor]]] = deque()

    def post_receive(self, task: Task) -> PendingReceive:
        """Post the receives that fill this task's input rows; returns at once."""
        boundary = task.teacher.start
        rows = task.rows[1] - task.rows[0]
        buffer = torch.empty((rows, *self.shapes[boundary]), device=self.device)
        handles = []
        for route in task.receive:
            part = buffer[route.start - task.rows[0] : route.stop - task.rows[0]]
            handles.append(_handle(dist.irecv(part, src=route.src, group=self.group, tag=_tag(task.step, route))))
        return PendingReceive(task.step, buffer, handles)

    def wait(self, pending: PendingReceive) -> torch.Tensor:
        for handle in pending.handles:
            handle.wait()
        return pending.buffer

    def send(self, task: Task, output: torch.Tensor) -> None:
        """Send each route's rows of `output`; wait only when the window of outstanding steps is full."""
        if not task.send:
            return
        while len(self._sends) >= self.max_in_flight:
            self._wait_oldest_send()
        handles, parts = [], []
        for route in task.send:
            part = output[route.start - task.rows[0] : route.stop - task.rows[0]].contiguous()
            handles.append(_handle(dist.isend(part, dst=route.dst, group=self.group, tag=_tag(task.step, route))))
            parts.append(part)
        self._sends.append((task.step, handles, parts))

    def drain(self) -> None:
        while self._sends:
            self._wait_oldest_send()

    def _wait_oldest_send(self) -> None:
        _, handles, _ = self._sends.popleft()
        for handle in handles:
            handle.wait()


def _handle(work: Handle | None) -> Handle:
    assert work is not None, "point-to-point calls from a group member always return a handle"
    return work


def _tag(step: int, route: Route) -> int:
    """A tag unique per step and boundary (gloo matches on it; NCCL ignores tags and keeps order)."""
    return (step * 1024 + route.boundary) % (2**31 - 1)


class GradientBuffers:
    """One flat gradient buffer per student block; parameters' .grad are views into it.

    Combining a block's gradients across replicas is then a single all-reduce of one tensor,
    started as soon as that block's backward is done so it overlaps the next block's backward.
    """

    def __init__(self, students: list[nn.Module], blocks: list[int]) -> None:
        self.flat: dict[int, torch.Tensor] = {}
        for block in blocks:
            params = [p for p in students[block].parameters() if p.requires_grad]
            total = sum(p.numel() for p in params)
            device = params[0].device if params else torch.device("cpu")
            flat = torch.zeros(total, device=device)
            offset = 0
            for param in params:
                param.grad = flat[offset : offset + param.numel()].view_as(param)
                offset += param.numel()
            self.flat[block] = flat

    def start_all_reduce(self, block: int, group: dist.ProcessGroup | None) -> Handle | None:
        if group is None or self.flat[block].numel() == 0:
            return None
        return dist.all_reduce(self.flat[block], op=dist.ReduceOp.SUM, group=group, async_op=True)

    def zero(self, block: int) -> None:
        self.flat[block].zero_()


def resolve_group(task: Task, stage_groups: dict[int, dist.ProcessGroup]) -> dist.ProcessGroup | None:
    """The group this task combines gradients over, or None when it trains alone."""
    if task.group is None:
        return None
    if task.group == WORLD:
        return dist.group.WORLD
    return stage_groups[task.group]


def timed_wait(handles: list[Handle | None]) -> float:
    started = time.perf_counter()
    for handle in handles:
        if handle is not None:
            handle.wait()
    return time.perf_counter() - started
