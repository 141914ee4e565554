"""Counting a module's forward FLOPs per sample with hooks on its leaves (Conv2d and Linear exactly,
everything else one operation per output element): for stage balancing before a profile exists, and
for the parameter and FLOP report of a trained network."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn


def module_flops(module: nn.Module, output: torch.Tensor) -> float:
    per_sample = output[0].numel() if output.dim() > 0 else 1
    if isinstance(module, nn.Conv2d):
        kernel = math.prod(module.kernel_size) * module.in_channels // module.groups
        return 2.0 * per_sample * kernel
    if isinstance(module, nn.Linear):
        return 2.0 * module.in_features * module.out_features
    return float(per_sample)  # normalisation, activation, pooling: about one op per output


def count_flops(block: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, float]:
    """(block(x), FLOPs of that forward per sample of x)."""
    total = [0.0]
    leaves = [m for m in block.modules() if not list(m.children())] or [block]

    def hook(module: nn.Module, _inputs: Any, output: Any) -> None:
        if isinstance(output, torch.Tensor):
            total[0] += module_flops(module, output)

    handles = [leaf.register_forward_hook(hook) for leaf in leaves]
    try:
        output = block(x)
    finally:
        for handle in handles:
            handle.remove()
    return output, total[0]
