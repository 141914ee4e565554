"""A layer's output channels: which layers can have their input-channel delta split across a stage
boundary (LayerPipe's moved share), and the shapes and weights that split touches."""

from __future__ import annotations

import torch
from torch import nn


def weight_of(layer: nn.Module) -> torch.Tensor:
    """The weight of a Linear or Conv2d."""
    assert isinstance(layer, nn.Linear | nn.Conv2d), f"{type(layer).__name__} has no delta to split"
    return layer.weight


def split_channels(layer: nn.Module) -> int | None:
    """How many input channels `layer`'s delta splits along, or None when it cannot be split."""
    if type(layer) is nn.Linear:
        return layer.in_features
    if type(layer) is nn.Conv2d and layer.groups == 1 and layer.padding_mode == "zeros":
        return layer.in_channels
    return None


SPLITTABLE = "a Linear, or a Conv2d with groups 1 and zero padding"


def channel_dim(layer: nn.Module) -> int:
    """The dimension of the layer's input that holds its channels."""
    return -1 if isinstance(layer, nn.Linear) else 1


def with_channels(shape: torch.Size | tuple[int, ...], layer: nn.Module, channels: int) -> torch.Size:
    sizes = list(shape)
    sizes[channel_dim(layer)] = channels
    return torch.Size(sizes)
