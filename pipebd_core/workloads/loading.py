"""Helpers every workload uses to build modules without touching the global RNG and to read weights."""

from __future__ import annotations

import math
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

import torch
from torch import nn

from pipebd_core.spec import SpecError

M = TypeVar("M", bound=nn.Module)


def uninitialised(factory: Callable[[], M]) -> M:
    """Build a module on the meta device (no init, no RNG), then give it uninitialised CPU storage."""
    with torch.device("meta"):
        module = factory()
    return module.to_empty(device="cpu")


def linear_from(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Linear:
    """An nn.Linear holding copies of `weight` (out, in) and `bias`, drawing no random numbers."""
    layer = uninitialised(lambda: nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None))
    with torch.no_grad():
        layer.weight.copy_(weight)
        if bias is not None:
            layer.bias.copy_(bias.detach())
    return layer


def read_state_dict(path: str, field: str) -> dict[str, torch.Tensor]:
    """Load a state_dict file on CPU (memory-mapped when possible, so the head is not read in)."""
    file = Path(path)
    if not file.is_file():
        raise SpecError(f"{field}: file not found: {path}")
    try:
        state = torch.load(file, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(file))
    except Exception as error:
        raise SpecError(
            f"{field}: cannot load {path} as a state_dict (save model.state_dict(), not the model): {error}"
        ) from None
    if not isinstance(state, Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise SpecError(f"{field}: {path} does not hold a state_dict (a mapping of names to tensors)")
    return dict(state)


def init_default(module: nn.Module, generator: torch.Generator) -> None:
    """PyTorch's default Conv2d/Linear initialisation drawn from `generator`, BatchNorm to 1 and 0."""
    for m in module.modules():
        if isinstance(m, nn.Conv2d | nn.Linear):
            nn.init.kaiming_uniform_(m.weight, a=math.sqrt(5), generator=generator)
            if m.bias is not None:
                bound = 1 / math.sqrt(m.weight[0].numel())
                nn.init.uniform_(m.bias, -bound, bound, generator=generator)
        elif isinstance(m, nn.BatchNorm2d):
            m.reset_parameters()
