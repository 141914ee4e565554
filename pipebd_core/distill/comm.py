"""Communication: process groups, teacher-activation relaying, and gradient combination.

Relaying is point-to-point on a process group of its own, so it never interleaves with the
collectives (barriers, all-reduces). The receive for step t+1 is posted before step t is computed,
and sends are not waited on each step: at most `max_in_flight` steps of sends stay outstanding,
which bounds memory while letting a producer run ahead of its consumers.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch
import torch.distributed as dist

from pipebd_core.distill.plan import Plan, Route
from pipebd_core.distill.schedule import WORLD, Task

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

    key: tuple[int, str]  # (step, round) of the task
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
            handles.append(_handle(dist.irecv(part, src=route.src, group=self.group, tag=_tag(task, route))))
        return PendingReceive((task.step, task.round), buffer, handles)

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
            handles.append(_handle(dist.isend(part, dst=route.dst, group=self.group, tag=_tag(task, route))))
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


def _tag(task: Task, route: Route) -> int:
    """A tag unique per step, round and boundary (gloo matches on it; NCCL ignores tags and keeps order)."""
    round_code = 1 if task.round == "arch" else 0
    return ((task.step * 2 + round_code) * 1024 + route.boundary) % (2**31 - 1)


def resolve_group(task: Task, stage_groups: dict[int, dist.ProcessGroup]) -> dist.ProcessGroup | None:
    """The group this task combines gradients over, or None when it trains alone."""
    if task.group is None:
        return None
    if task.group == WORLD:
        return dist.group.WORLD
    return stage_groups[task.group]
