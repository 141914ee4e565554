"""Teacher/student block pairs: what a job distils, independent of how it is scheduled.

Every rank builds the same workload: initialisation is seeded per block (see `block_seed`), so a
block's starting weights never depend on the mode, the number of ranks or which rank builds it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from pipebd_core.documents.architecture import Architecture
from pipebd_core.documents.profile import Profile
from pipebd_core.spec import Spec
from pipebd_core.workloads.builders import BUILDERS, CUSTOM_BUILDER


@dataclass(frozen=True)
class SearchSettings:
    """How the architecture parameters of searchable students (supernet blocks) are trained."""

    arch_lr: float  # Adam learning rate, betas (0, 0.999)
    update_every: int  # weight steps between architecture updates
    warmup: float  # fraction of the training steps before the first architecture update
    holdout: float  # fraction of the data set held out for architecture batches


@dataclass
class Workload:
    """Teacher blocks T_0..T_{B-1}, student blocks S_0..S_{B-1} and how to report on them."""

    teacher_blocks: list[nn.Module]  # eval mode, no gradients; x_{i+1} = T_i(x_i)
    student_blocks: list[nn.Module]  # S_i learns MSE(S_i(x_i), T_i(x_i))
    block_names: list[str]  # one human-readable name per block, e.g. "conv3_1"
    # Builds the compressed network (teacher with its blocks replaced by trained students), if any.
    assemble: Callable[[Sequence[nn.Module]], nn.Module] | None = None
    # Builds the whole teacher network (blocks plus head) for the accuracy report, if any.
    teacher_network: Callable[[], nn.Module] | None = None
    warnings: list[str] = field(default_factory=list)
    losses: list[str] = field(default_factory=list)  # per block: train.loss (the default) or "soft_ce"
    search: SearchSettings | None = None  # set when the students are supernets with architecture parameters
    # Derives (architecture description, standalone searched network) from trained supernet students (and
    # the job's profile, where it has one: a transformer search's latency budget reads its timings).
    derive: Callable[[Sequence[nn.Module], Profile | None], tuple[Architecture, nn.Module]] | None = None
    # Exports the distilled (compressed or searched) network to a file, beside its state_dict: a language
    # model's torch.export program over token ids of any batch and length (workloads/transformer.py).
    export: Callable[[nn.Module, Path], None] | None = None
    # Writes the distilled network (with a search's architecture) as a Hugging Face model directory: a
    # language model's (workloads/hf_directory.py).
    hf_directory: Callable[[nn.Module, Architecture | None, Path], None] | None = None

    @property
    def num_blocks(self) -> int:
        return len(self.teacher_blocks)

    def loss_of(self, block: int) -> str:
        return self.losses[block] if self.losses else "mse"  # build_workload sets train.loss


def search_settings(spec: Spec) -> SearchSettings | None:
    """The architecture-search settings of a nas spec; None for workloads without a search."""
    w = spec.workload
    if w.kind != "nas":
        return None
    return SearchSettings(w.arch_lr, w.arch_update_every, w.arch_warmup, w.arch_holdout)


def block_seed(seed: int, role: str, index: int) -> int:
    """A seed for one block's initialisation, independent of every other block."""
    role_code = {"teacher": 1, "student": 2, "head": 3}[role]
    return (seed * 1_000_003 + role_code * 10_007 + index) % (2**63 - 1)


def seeded(seed: int, role: str, index: int) -> torch.Generator:
    """A CPU generator seeded for one block; pass it to init functions instead of touching global RNG."""
    return torch.Generator().manual_seed(block_seed(seed, role, index))


def path_generator(seed: int, block: int, step: int, round_: str) -> torch.Generator:
    """The generator a supernet block samples its paths from: the same on every rank that holds it."""
    round_code = {"weights": 0, "arch": 1}[round_]
    mixed = (block_seed(seed, "student", block) * 1_000_033 + step * 4 + round_code) % (2**63 - 1)
    return torch.Generator().manual_seed(mixed)


def build_workload(spec: Spec) -> Workload:
    """Build the workload the spec names, on CPU, identically on every rank."""
    module, builder = BUILDERS.get(spec.workload.kind, CUSTOM_BUILDER)
    workload: Workload = getattr(importlib.import_module(module), builder)(spec)
    workload.losses = workload.losses or [spec.train.loss] * workload.num_blocks
    for teacher in workload.teacher_blocks:
        teacher.eval()
        teacher.requires_grad_(False)
    return workload
