"""One student block on one rank: its module, optimisers, flat gradient buffers and loss.

Weights are optimised by `torch.optim.SGD` (lr, momentum, weight decay from the spec). Students that
are supernets (nas) also have architecture parameters, optimised by Adam with betas (0, 0.999) in
a round of their own; each round has its own flat gradient buffer, so combining a round's
gradients across replicas is one all-reduce of one tensor.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from pipebd_core.spec import Spec
from pipebd_core.workloads.losses import LOSSES, block_loss
from pipebd_core.workloads.supernet import SupernetBlock
from pipebd_core.workloads.workload import SearchSettings, path_generator


class FlatGradients:
    """One flat buffer whose slices are the parameters' .grad: autograd accumulates into it in place."""

    def __init__(self, params: list[nn.Parameter], device: torch.device) -> None:
        self.flat = torch.zeros(sum(p.numel() for p in params), device=device)
        offset = 0
        for param in params:
            param.grad = self.flat[offset : offset + param.numel()].view_as(param)
            offset += param.numel()

    def start_all_reduce(self, group: dist.ProcessGroup | None) -> dist.Work | None:
        if group is None or self.flat.numel() == 0:
            return None
        return dist.all_reduce(self.flat, op=dist.ReduceOp.SUM, group=group, async_op=True)

    def zero(self) -> None:
        self.flat.zero_()


class StudentBlock:
    def __init__(
        self, index: int, module: nn.Module, loss: str, spec: Spec, search: SearchSettings | None, device: torch.device
    ) -> None:
        self.index, self.module, self.seed = index, module.to(device).train(), spec.train.seed
        self.loss_fn = LOSSES[loss]
        self.supernet = module if search is not None and isinstance(module, SupernetBlock) else None
        arch = self.supernet.arch_parameters() if self.supernet is not None else []
        arch_ids = {id(p) for p in arch}
        weights = [p for p in module.parameters() if p.requires_grad and id(p) not in arch_ids]
        train = spec.train
        self.optimizer = torch.optim.SGD(weights, lr=train.lr, momentum=train.momentum, weight_decay=train.weight_decay)
        self.gradients = {"weights": FlatGradients(weights, device)}
        self.arch_optimizer: torch.optim.Optimizer | None = None
        if self.supernet is not None and search is not None:
            self.arch_optimizer = torch.optim.Adam(arch, lr=search.arch_lr, betas=(0.0, 0.999))
            self.gradients["arch"] = FlatGradients(arch, device)

    def begin(self, step: int, round_: str) -> None:
        """Sample this step's paths (supernets), from a generator seeded per block, step and round."""
        if self.supernet is not None:
            self.supernet.begin_round(round_, path_generator(self.seed, self.index, step, round_))

    def loss(self, inputs: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return block_loss(self.module, self.loss_fn, inputs, target)

    def start_all_reduce(self, round_: str, group: dist.ProcessGroup | None) -> dist.Work | None:
        return self.gradients[round_].start_all_reduce(group)

    def update(self, round_: str, lr: float) -> None:
        """Step the round's optimiser, then clear every gradient (a softmax-gated weight round touches alpha)."""
        if round_ == "weights":
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            self.optimizer.step()
        else:
            assert self.arch_optimizer is not None, "an arch round needs a supernet student"
            self.arch_optimizer.step()
        for gradients in self.gradients.values():
            gradients.zero()

    def probabilities(self) -> list[list[float]] | None:
        return self.supernet.probabilities() if self.supernet is not None else None

    def sampled(self) -> list[list[int]] | None:
        """The paths this step drew, per searchable layer (supernets with binary gates), else None."""
        drawn = self.supernet.sampled() if self.supernet is not None else []
        return drawn if any(drawn) else None  # softmax gates draw nothing

    def state(self) -> dict[str, Any]:
        state = {"student": self.module.state_dict(), "optimizer": self.optimizer.state_dict()}
        if self.arch_optimizer is not None:
            state["arch_optimizer"] = self.arch_optimizer.state_dict()
        return state

    def load(self, state: dict[str, Any]) -> None:
        self.module.load_state_dict(state["student"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.arch_optimizer is not None:
            self.arch_optimizer.load_state_dict(state["arch_optimizer"])
