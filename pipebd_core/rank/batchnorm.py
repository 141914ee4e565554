"""Batch normalisation across ranks: every shard of a split batch normalised as one batch, on any backend.

Where a student's rows are split across ranks (`dp`, `ir`, a replicated stage of `hybrid`/`auto`),
each rank holds a shard of the global batch. `CrossRankBatchNorm` normalises every shard with the
statistics of the whole batch, so the replicas compute what one `nn.BatchNorm1d/2d/3d` computes on
the concatenated batch, shards of unequal size included, on gloo (CPU, where PyTorch's
`SyncBatchNorm` refuses to run) as on NCCL. `convert` swaps it in for a module's BatchNorm layers,
keeping their parameters, buffers and state_dict keys.

What one layer communicates in its process group, per training step:
- forward: one all-gather of each shard's row count and per-channel mean and M2 (sum of squared
  deviations), 2C + 1 float64 values; every rank combines them in rank order (Chan et al.'s
  parallel variance), so all replicas hold bit-identical statistics and running buffers;
- backward: one all-reduce of the per-channel sums of dy and dy * xhat (2C float64 values), which
  the input gradient needs. The weight and bias gradients stay the shard's own sums: the runtime's
  gradient all-reduce adds them up like every other parameter's.
Eval mode with running statistics normalises locally and talks to no one (without running
statistics it uses the batch's, as nn.BatchNorm does, and so synchronises like training).

Numerics: each shard is centred on its own mean (rounded to its dtype) before anything is squared, and
that rounding is recovered from the sum of the deviations; after the combination every shard is
measured from the same copy of the global mean in its dtype, with that copy's rounding kept apart. So a
large mean (1e4 with unit variance) loses nothing to the cancellation of E[x^2] - E[x]^2, nor (unlike
float32 nn.BatchNorm's x * a + b) to the output's. Per-channel statistics are combined in float64.
"""

from __future__ import annotations

import os
from copy import deepcopy
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from pipebd_core.rank import batchnorm

# The input ranks each converted class accepts: (N, C) or (N, C, L), (N, C, H, W), (N, C, D, H, W).
INPUT_DIMS: dict[type[nn.Module], tuple[int, ...]] = {
    nn.BatchNorm1d: (2, 3),
    nn.BatchNorm2d: (4,),
    nn.BatchNorm3d: (5,),
}


def _channel_shape(x: torch.Tensor) -> list[int]:
    """The shape that broadcasts a per-channel vector over x: (1, C, 1, ...)."""
    return [1, x.size(1)] + [1] * (x.dim() - 2)


def channel_sums(a: torch.Tensor, b: torch.Tensor, centre: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per channel, sum(a) and sum(a * (b - centre)) in one fused pass, whatever the tensors' rank.

    This is the reduction of aten's batch-norm backward (its grad_bias, and grad_weight with unit
    invstd), so it costs what nn.BatchNorm's own backward reduction costs."""
    ones = torch.ones_like(centre)
    _, dot, total = torch.ops.aten.native_batch_norm_backward(
        a, b, None, None, None, centre, ones, True, 0.0, [False, True, True]
    )
    return total, dot


class Shard(NamedTuple):
    """One rank's rows of a batch, summarised per channel."""

    moments: torch.Tensor  # [count, mean (C), M2 (C)], float64
    deviation: torch.Tensor  # x minus the shard's own mean rounded to x's dtype


def shard_moments(x: torch.Tensor) -> Shard:
    """This shard's count, mean and M2 per channel, without squaring x itself.

    x is centred on its mean rounded to x's dtype, and that rounding is recovered from the
    deviations: mean = centre + sum(d) / n and M2 = sum(d^2) - sum(d)^2 / n, where sum(d) is tiny."""
    count = x.numel() // x.size(1)
    centre = x.mean([0, *range(2, x.dim())], keepdim=True)
    deviation = x - centre
    first, second = torch.stack(channel_sums(deviation, deviation, torch.zeros_like(centre.flatten()))).double()
    centre64 = centre.flatten().double()
    mean, m2 = centre64 + first / count, second - first * first / count
    return Shard(torch.cat([mean.new_full((1,), float(count)), mean, m2]), deviation)


def combine_moments(parts: torch.Tensor) -> tuple[float, torch.Tensor, torch.Tensor]:
    """(count, mean, M2) of the union of shards given as rows [count, mean (C), M2 (C)] (Chan et al.).

    Each shard weighs by its row count; the spread of the shard means adds n_k (mean_k - mean)^2."""
    channels = (parts.size(1) - 1) // 2
    counts, means, m2s = parts[:, :1], parts[:, 1 : 1 + channels], parts[:, 1 + channels :]
    total = counts.sum()
    mean = (counts * means).sum(0) / total
    m2 = m2s.sum(0) + (counts * (means - mean) ** 2).sum(0)
    return float(total), mean, m2


def gather_moments(moments: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Every rank's moments, one row per rank in rank order."""
    parts = [torch.empty_like(moments) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, moments, group=group)
    return torch.stack(parts)


class CrossRankNorm(torch.autograd.Function):
    """Normalisation with the statistics of every rank's shard; the input gradient over the whole batch.

    After the statistics are combined, every shard is measured from the same copy of the global mean in
    x's dtype, d = x - centre (exact near it), and the copy's rounding r = mean - centre is kept apart, so
    xhat = (d - r) * invstd; d is saved for the backward instead of x."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor | None,
        bias: torch.Tensor | None,
        running: tuple[torch.Tensor, torch.Tensor] | None,
        factor: float,
        eps: float,
        group: dist.ProcessGroup,
    ) -> torch.Tensor:
        shard = shard_moments(x)
        count, mean, m2 = combine_moments(gather_moments(shard.moments, group))
        if count < 2:
            raise ValueError(
                f"cross-rank BatchNorm: the batch over all {dist.get_world_size(group)} ranks has {count:.0f}"
                f" value per channel (input {tuple(x.shape)} on this rank); training needs more than one:"
                " use a larger batch"
            )
        if running is not None:  # as nn.BatchNorm: exponential (momentum None: cumulative) average, unbiased
            running[0].lerp_(mean.to(x.dtype), factor)
            running[1].lerp_((m2 / (count - 1)).to(x.dtype), factor)
        centre = mean.to(x.dtype)
        deviation = torch.sub(x, centre.view(_channel_shape(x)), out=shard.deviation)  # reuses the shard's buffer
        rounding = (mean - centre.double()).to(x.dtype)
        ctx.save_for_backward(deviation, rounding, weight)
        ctx.invstd, ctx.count, ctx.group = torch.rsqrt(m2 / count + eps), count, group
        return F.batch_norm(deviation, rounding, (m2 / count).to(x.dtype), weight, bias, False, 0.0, eps)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        deviation, rounding, weight = ctx.saved_tensors
        invstd, channels = ctx.invstd, grad.size(1)
        sums = torch.cat(channel_sums(grad, deviation, rounding)).double()
        sums[channels:] *= invstd  # [sum dy, sum dy * xhat]
        # the shard's own sums (copies: the all-reduce below overwrites `sums`)
        grad_weight = sums[channels:].to(grad.dtype, copy=True) if ctx.needs_input_grad[1] else None
        grad_bias = sums[:channels].to(grad.dtype, copy=True) if ctx.needs_input_grad[2] else None
        if not ctx.needs_input_grad[0]:
            return None, grad_weight, grad_bias, None, None, None, None
        dist.all_reduce(sums, group=ctx.group)
        mean_dy, mean_dy_xhat = (sums / ctx.count).chunk(2)
        # dx = s (dy - mean_dy - xhat mean_dy_xhat) = s dy + on_d d + constant, s = invstd * weight
        scale = invstd if weight is None else invstd * weight.double()
        on_d = -scale * invstd * mean_dy_xhat
        constant = -scale * mean_dy - on_d * rounding.double()
        scale, on_d, constant = torch.stack([scale, on_d, constant]).to(grad.dtype).view(3, *_channel_shape(grad))
        grad_input = grad * scale
        grad_input.addcmul_(deviation, on_d).add_(constant)
        return grad_input, grad_weight, grad_bias, None, None, None, None


class CrossRankBatchNorm(_BatchNorm):
    """nn.BatchNorm1d/2d/3d whose batch statistics span every rank of `group` (same state_dict keys)."""

    def __init__(
        self,
        num_features: int,
        group: dist.ProcessGroup,
        input_dims: tuple[int, ...],
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device=device)
        self.group, self.input_dims = group, input_dims

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() not in self.input_dims:
            wanted = " or ".join(f"{d}D" for d in self.input_dims)
            raise ValueError(
                f"cross-rank BatchNorm over {self.num_features} channels: expected {wanted} input, got"
                f" {input.dim()}D {tuple(input.shape)}"
            )

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        running = (
            None if self.running_mean is None or self.running_var is None else (self.running_mean, self.running_var)
        )
        if not self.training and running is not None:  # normalise with the running statistics: nothing to share
            return F.batch_norm(input, *running, self.weight, self.bias, False, 0.0, self.eps)
        if not (self.training and self.track_running_stats):
            running = None  # batch statistics that update nothing (as nn.BatchNorm)
        factor = self._count_batch() if running is not None else 0.0
        return CrossRankNorm.apply(input, self.weight, self.bias, running, factor, self.eps, self.group)

    def _count_batch(self) -> float:
        """Count one more training batch; the weight of its statistics in the running averages (nn.BatchNorm's)."""
        tracked = self.num_batches_tracked
        assert tracked is not None, "track_running_stats registers num_batches_tracked"
        tracked.add_(1)
        return self.momentum if self.momentum is not None else 1.0 / float(tracked)


def convert(module: nn.Module, group: dist.ProcessGroup) -> nn.Module:
    """`module` with every BatchNorm1d/2d/3d replaced by a CrossRankBatchNorm over `group` holding the
    same parameters and buffers; children are replaced in place (as nn.SyncBatchNorm.convert_sync_batchnorm
    does), and a BatchNorm given itself comes back as its replacement."""
    dims = next((dims for kind, dims in INPUT_DIMS.items() if isinstance(module, kind)), None)
    if isinstance(module, _BatchNorm) and dims is not None:
        return _cross_rank(module, group, dims)
    for name, child in module.named_children():
        module.add_module(name, convert(child, group))
    return module


def _cross_rank(norm: _BatchNorm, group: dist.ProcessGroup, dims: tuple[int, ...]) -> CrossRankBatchNorm:
    """The replacement of one BatchNorm: built on the meta device, then given the original's tensors."""
    cross = CrossRankBatchNorm(
        norm.num_features, group, dims, norm.eps, norm.momentum, norm.affine, norm.track_running_stats, device="meta"
    )
    if norm.affine:
        cross.weight, cross.bias = norm.weight, norm.bias
    cross.running_mean, cross.running_var = norm.running_mean, norm.running_var
    cross.num_batches_tracked = norm.num_batches_tracked
    return cross.train(norm.training)


# A benchmark knob, not a setting: "1" makes split rows keep shard-local BatchNorm statistics, so that
# benchmarks/batchnorm_cost.py can time the same runs with and without synchronised statistics.
LOCAL_BATCHNORM_ENV = "PIPEBD_BENCH_LOCAL_BATCHNORM"


def with_sync_batchnorm(module: nn.Module, group: dist.ProcessGroup | None, device: torch.device) -> nn.Module:
    """The student a rank trains: where its rows are split across ranks (a gradient group of more than one
    rank), a copy whose BatchNorm layers normalise over the group's whole batch, as full-batch training
    does: PyTorch's SyncBatchNorm on GPUs, the cross-rank BatchNorm of pipebd_core.rank.batchnorm elsewhere
    (SyncBatchNorm refuses CPU tensors). A block trained alone keeps `module` itself, with plain BatchNorm.
    The workload's own modules are never converted, so what finalize assembles holds plain BatchNorm."""
    if group is None or dist.get_world_size(group) == 1 or os.environ.get(LOCAL_BATCHNORM_ENV) == "1":
        return module
    copy = deepcopy(module)
    if device.type == "cuda":
        return nn.SyncBatchNorm.convert_sync_batchnorm(copy, process_group=group)
    return batchnorm.convert(copy, group)
