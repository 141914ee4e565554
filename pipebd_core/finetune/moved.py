"""LayerPipe's moved delta: a share of a boundary layer's input gradient computed by the next stage.

The boundary layer is the last layer of stage s, a Conv2d (groups 1) or a Linear. Its delta, the input
gradient dL/dx = f(dL/dy, W), splits along the channels of x: channel c of dL/dx needs only W[:, c]. With
`k` of its C input channels moved to stage s+1, every step runs:

    forward, micro-batch 0   stage s sends W[:, C-k:] (k/C of the weight) with its output to stage s+1
    backward, micro-batch m  stage s+1 computes dL/dy (the gradient it sends back anyway), then from it
                             dL/dx[:, C-k:] = f(dL/dy, W[:, C-k:]), and sends both back
                             stage s computes dL/dx[:, :C-k] = f(dL/dy, W[:, :C-k]) and concatenates the
                             two where the layer before consumes them

The weight gradient stays with stage s, which has x and dL/dy. Stage s+1 holds the slice only (it is no
parameter of its own: its optimiser never sees it). `GivenShare` is stage s's side, `TakenShare` stage
s+1's; pipeline.TimedStage adds their sends and receives to those of the stage. A backward outside any
schedule (the stage's own shape inference, on dummy tensors) computes the whole input gradient locally.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from pipebd_core.finetune.plan import TrainPlan
from pipebd_core.rank.channels import channel_dim, weight_of, with_channels
from pipebd_core.rank.deferred import Kept, WeightGradients, input_gradient, weight_gradients


@dataclass
class GivenShare:
    """Stage s's side: the boundary layer keeps the first C - k channels of its delta and takes the other k
    from stage s+1 (one receive buffer per micro-batch, filled by the schedule's receives)."""

    layer: nn.Module
    moved: int  # k: the last k input channels' gradient comes from the next stage
    input_shape: torch.Size  # one micro-batch's input of the boundary layer
    device: torch.device
    kept: Kept | None = None  # zb: the weight gradient's inputs, kept for the deferred W
    current: int | None = None  # the micro-batch whose backward is running, set by the stage
    buffers: dict[int, torch.Tensor] = field(default_factory=dict)
    combined: int = 0  # micro-batches whose delta was put together from both stages (telemetry)

    def install(self) -> None:
        """Route the boundary layer's forward through the split backward."""
        layer = self.layer
        assert isinstance(layer, nn.Linear | nn.Conv2d)
        layer.forward = lambda x: _GivenInput.apply(x, layer.weight, layer.bias, self)  # type: ignore[method-assign, assignment]

    def weight_slice(self) -> torch.Tensor:
        """What stage s+1 needs this step: the weight columns of the moved channels (a copy to send)."""
        weight = weight_of(self.layer).detach()
        return weight[:, weight.shape[1] - self.moved :].contiguous()

    def buffer(self, microbatch: int) -> torch.Tensor:
        if microbatch not in self.buffers:
            shape = with_channels(self.input_shape, self.layer, self.moved)
            self.buffers[microbatch] = torch.empty(shape, device=self.device)
        return self.buffers[microbatch]

    def input_gradient(self, shape: torch.Size, weight: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        """dL/dx: the kept channels computed here and the moved ones received, or all of it here outside a
        schedule's backward."""
        if self.current is None:
            return input_gradient(self.layer, weight, grad, shape)
        own = weight.shape[1] - self.moved
        mine = input_gradient(self.layer, weight[:, :own], grad, with_channels(shape, self.layer, own))
        self.combined += 1
        return torch.cat([mine, self.buffers[self.current]], dim=channel_dim(self.layer))


class _GivenInput(torch.autograd.Function):
    """The boundary layer on stage s: its forward as it is; in the backward the split delta and, unless the
    weight gradient is deferred (zb), the weight gradient at once."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, share: GivenShare
    ) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.share = share
        layer = share.layer
        if isinstance(layer, nn.Linear):
            return F.linear(x, weight, bias)
        assert isinstance(layer, nn.Conv2d)
        return F.conv2d(x, weight, bias, layer.stride, layer.padding, layer.dilation, layer.groups)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, None]:
        x, weight = ctx.saved_tensors
        share: GivenShare = ctx.share
        dx = share.input_gradient(x.shape, weight, grad)
        if share.kept is not None:
            share.kept.keep(x, grad)
            return dx, None, None, None
        dw, db = weight_gradients(share.layer, x, grad)
        return dx, dw, db, None


@dataclass
class TakenShare:
    """Stage s+1's side: the weight slice received each step, and the moved channels' input gradient it
    computes from the output gradient of each micro-batch's backward."""

    layer: nn.Module  # this rank's copy of the boundary layer: its kind and hyperparameters, not its weights
    moved: int
    input_shape: torch.Size  # one micro-batch's input of the boundary layer
    device: torch.device
    weight: torch.Tensor = field(init=False)
    partials: dict[int, torch.Tensor] = field(default_factory=dict)  # per micro-batch, until sent
    computed: int = 0  # micro-batches whose moved delta this stage computed (telemetry)

    def __post_init__(self) -> None:
        full = weight_of(self.layer)
        shape = (full.shape[0], self.moved, *full.shape[2:])
        self.weight = torch.empty(shape, device=self.device)

    def compute(self, microbatch: int, grad: torch.Tensor) -> None:
        """The moved channels of dL/dx from dL/dy (this stage's input gradient) and the received slice."""
        with torch.no_grad():
            shape = with_channels(self.input_shape, self.layer, self.moved)
            self.partials[microbatch] = input_gradient(self.layer, self.weight, grad, shape)
        self.computed += 1


def stage_shares(
    plan: TrainPlan, rank: int, layers: list[nn.Module], device: torch.device, weights: WeightGradients | None
) -> tuple[GivenShare | None, TakenShare | None]:
    """This rank's part in the moves of `plan`: the share its last layer gives to the next stage (installed
    on that layer, which must be this rank's own module's), and the share it takes from the previous one."""
    gives = takes = None
    if plan.moved_at(rank):
        _, stop = plan.stages[rank]
        layer = layers[stop - 1]
        shape = torch.Size((plan.microbatch_size, *plan.shapes[stop - 1]))
        kept = weights.layers.get(layer) if weights is not None else None
        gives = GivenShare(layer, plan.moved_at(rank), shape, device, kept)
        gives.install()
    if plan.moved_at(rank - 1):
        start, _ = plan.stages[rank]
        shape = torch.Size((plan.microbatch_size, *plan.shapes[start - 1]))
        takes = TakenShare(layers[start - 1], plan.moved_at(rank - 1), shape, device)
    return gives, takes


def recv(tensor: torch.Tensor, peer: int, group: dist.ProcessGroup | None) -> dist.P2POp:
    return dist.P2POp(dist.irecv, tensor, peer, group)


def send(tensor: torch.Tensor, peer: int, group: dist.ProcessGroup | None) -> dist.P2POp:
    return dist.P2POp(dist.isend, tensor, peer, group)
