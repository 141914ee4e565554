"""A transformer teacher cut where its blocks begin and end: what every family's loader hands the workload."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn


@dataclass
class ModelParts:
    """The module preparing block 0's input, the layers (one block each), the head after the last block."""

    embedding: nn.Module  # token ids or images to block 0's hidden states
    layers: list[nn.Module]  # the teacher's decoder or encoder layers
    head: nn.Module  # the last block's hidden states to logits
    hidden_size: int
    wrap: Callable[[nn.Module], nn.Module]  # a layer (the teacher's, or a replacement's copy) as a block

    def block(self, layer: nn.Module) -> nn.Module:
        return self.wrap(layer)
