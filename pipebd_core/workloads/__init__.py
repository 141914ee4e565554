"""Teacher/student block pairs: what a job distils, independent of how it is scheduled.

Every rank builds the same workload: initialisation is seeded per block (see `block_seed`), so a
block's starting weights never depend on the mode, the number of ranks or which rank builds it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from pipebd_core.spec import Spec


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

    @property
    def num_blocks(self) -> int:
        return len(self.teacher_blocks)


def block_seed(seed: int, role: str, index: int) -> int:
    """A seed for one block's initialisation, independent of every other block."""
    role_code = {"teacher": 1, "student": 2, "head": 3}[role]
    return (seed * 1_000_003 + role_code * 10_007 + index) % (2**63 - 1)


def seeded(seed: int, role: str, index: int) -> torch.Generator:
    """A CPU generator seeded for one block; pass it to init functions instead of touching global RNG."""
    return torch.Generator().manual_seed(block_seed(seed, role, index))


def build_workload(spec: Spec) -> Workload:
    """Build the workload the spec names, on CPU, identically on every rank."""
    if spec.workload.kind == "compression":
        from pipebd_core.workloads.compression import build_compression_workload

        workload = build_compression_workload(spec)
    else:
        from pipebd_core.workloads.custom import build_custom_workload

        workload = build_custom_workload(spec)
    for teacher in workload.teacher_blocks:
        teacher.eval()
        teacher.requires_grad_(False)
    return workload
