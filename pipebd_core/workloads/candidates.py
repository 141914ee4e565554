"""A student block that trains several candidate replacements of one teacher block side by side.

Every candidate is trained against the same teacher output: the block's loss is the sum of the
candidates' losses, and as no weight is shared, each candidate's gradient is exactly the one it would
get trained alone (the Puzzle way of searching: train every alternative, pick afterwards). With one
candidate the block is plain compression. A fixed `prefix` (block 0's token embedding: the teacher's own
module, frozen) runs before the candidates; it is not registered as a submodule, so it is neither trained
nor in the block's state_dict (checkpoints hold the candidates only), but it moves with the block.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

LossFunction = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def replaced_layer(teacher: nn.Module) -> nn.Module:
    """The teacher layer a block's candidates replace: block 0's teacher is (its prefix, the layer)."""
    return teacher[-1] if isinstance(teacher, nn.Sequential) else teacher


class Candidates(nn.Module):
    """Candidates of one block, named; `forward` averages their outputs (only shapes and costs read it)."""

    def __init__(self, names: Sequence[str], options: Sequence[nn.Module], prefix: nn.Module | None = None) -> None:
        super().__init__()
        assert len(names) == len(options) > 0, "one name per candidate, at least one"
        self.names = list(names)
        self.options = nn.ModuleList(options)
        self._prefix = () if prefix is None else (prefix.requires_grad_(False),)  # a tuple: not registered

    @property
    def prefix(self) -> nn.Module | None:
        return self._prefix[0] if self._prefix else None

    def _apply(self, fn: Callable[..., Any], recurse: bool = True) -> Candidates:
        """`.to(device)` and the like reach the unregistered prefix too."""
        for prefix in self._prefix:
            prefix._apply(fn, recurse)
        return super()._apply(fn, recurse)

    def prepare(self, x: torch.Tensor) -> torch.Tensor:
        if self.prefix is None:
            return x
        with torch.no_grad():
            return self.prefix(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.prepare(x)
        outputs = [option(hidden) for option in self.options]
        return outputs[0] if len(outputs) == 1 else torch.stack(outputs).mean(0)

    def candidate_losses(self, x: torch.Tensor, target: torch.Tensor, loss_fn: LossFunction) -> torch.Tensor:
        """Each candidate's loss against the teacher's output, in `names` order."""
        hidden = self.prepare(x)
        return torch.stack([loss_fn(option(hidden), target) for option in self.options])

    def chosen(self, index: int) -> nn.Module:
        """Candidate `index` alone, behind the prefix: the block a search picked."""
        option = self.options[index]
        return option if self.prefix is None else nn.Sequential(self.prefix, option)
