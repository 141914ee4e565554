"""The block losses a student learns its teacher block by (`train.loss`), by name."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from pipebd_core.workloads.candidates import Candidates
from pipebd_core.workloads.supernet import soft_cross_entropy

LossFunction = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def normalised_mse(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per sample, the squared error over the teacher output's energy, then the mean over samples (a mean
    over rows, so shard-weighted gradients still sum to the full batch's)."""
    error = (output - target).flatten(1).pow(2).sum(1)
    return (error / target.flatten(1).pow(2).sum(1).clamp_min(1e-12)).mean()


def cosine_distance(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """1 - cosine similarity of each feature vector (a token's hidden state: the last dimension of
    (batch, tokens, hidden); a position's channels: dimension 1 otherwise), averaged."""
    dim = -1 if output.dim() == 3 else 1
    return (1 - F.cosine_similarity(output, target, dim=dim)).mean()


LOSSES: dict[str, LossFunction] = {
    "mse": F.mse_loss,
    "nmse": normalised_mse,
    "cosine": cosine_distance,
    "soft_ce": soft_cross_entropy,
}


def block_loss(module: nn.Module, loss_fn: LossFunction, inputs: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """A student block's loss: of its output, or the sum of its candidates' (each trains as if alone)."""
    if isinstance(module, Candidates):
        return module.candidate_losses(inputs, target, loss_fn).sum()
    return loss_fn(module(inputs), target)
