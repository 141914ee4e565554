"""Static facts about a workload, from one forward pass on a single sample.

Shapes at every block boundary (to size receive buffers), and per-block FLOP estimates used to
balance stages and bin-pack layerwise tasks until measured profiles are available.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from pipebd_core.spec import SpecError
from pipebd_core.workloads.flops import count_flops
from pipebd_core.workloads.workload import Workload

STUDENT_TRAIN_FACTOR = 3.0  # forward + backward of a student costs about three forwards


@dataclass
class BlockProbe:
    shapes: list[list[int]]  # per-sample shape of x_0 .. x_B
    teacher_flops: list[float]  # per sample, forward
    student_flops: list[float]  # per sample, forward
    student_params: list[int]
    teacher_params: list[int]

    @property
    def teacher_costs(self) -> list[float]:
        return self.teacher_flops

    @property
    def student_costs(self) -> list[float]:
        return [STUDENT_TRAIN_FACTOR * flops for flops in self.student_flops]

    def stage_costs(self) -> list[float]:
        """Teacher plus student work of each block, as a pipeline stage pays it."""
        return [t + s for t, s in zip(self.teacher_costs, self.student_costs, strict=True)]

    def prefix_costs(self) -> list[float]:
        """What a task re-running the teacher from the input pays for each block (dp, ls)."""
        total, costs = 0.0, []
        for teacher, student in zip(self.teacher_costs, self.student_costs, strict=True):
            total += teacher
            costs.append(total + student)
        return costs

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _forward(block: nn.Module, x: torch.Tensor, what: str) -> tuple[torch.Tensor, float]:
    """One counted forward; a block that cannot take its input is the workload's fault, said before launch."""
    try:
        return count_flops(block, x)
    except Exception as error:
        raise SpecError(
            f"workload: {what} fails on an input of shape {tuple(x.shape[1:])}: {type(error).__name__}: {error}"
        ) from error


def block_input(shape: Sequence[int], batch: int, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """A stand-in for `batch` inputs of a block: random floats, or zeros where the input is integral (the
    token ids a transformer's block 0 embeds)."""
    if dtype.is_floating_point:
        return torch.randn((batch, *shape), dtype=dtype, device=device)
    return torch.zeros((batch, *shape), dtype=dtype, device=device)


def probe_workload(workload: Workload, sample: torch.Tensor) -> BlockProbe:
    """Run every teacher and student block once on one zero sample like `sample` (eval mode, no gradients)."""
    shapes = [list(sample.shape)]
    teacher_flops, student_flops = [], []
    x = torch.zeros((1, *sample.shape), dtype=sample.dtype)
    with torch.no_grad():
        for teacher, student in zip(workload.teacher_blocks, workload.student_blocks, strict=True):
            was_training = student.training
            student.eval()
            index = len(shapes) - 1
            student_out, s_flops = _forward(student, x, f"student block {index}")
            student.train(was_training)
            x, t_flops = _forward(teacher, x, f"teacher block {index}")
            if student_out.shape != x.shape:
                raise SpecError(
                    f"workload: block {index}: student output {tuple(student_out.shape[1:])} differs from the"
                    f" teacher's {tuple(x.shape[1:])}; a student must reproduce its teacher block's output shape"
                )
            shapes.append(list(x.shape[1:]))
            teacher_flops.append(t_flops)
            student_flops.append(s_flops)
    return BlockProbe(
        shapes=shapes,
        teacher_flops=teacher_flops,
        student_flops=student_flops,
        student_params=[sum(p.numel() for p in s.parameters()) for s in workload.student_blocks],
        teacher_params=[sum(p.numel() for p in t.parameters()) for t in workload.teacher_blocks],
    )
