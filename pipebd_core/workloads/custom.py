"""Custom workloads: a user factory returns (teacher_blocks, student_blocks)."""

from __future__ import annotations

import torch
from torch import nn

from pipebd_core.imports import call_factory
from pipebd_core.spec import Spec, SpecError
from pipebd_core.workloads.workload import Workload, block_seed


def build_custom_workload(spec: Spec) -> Workload:
    """Call the factory under a fixed seed so every rank builds identical blocks."""
    assert spec.workload.factory is not None
    torch.manual_seed(block_seed(spec.train.seed, "teacher", 0))
    result = call_factory(spec.workload.factory, "workload.factory", spec.workload.options)
    if not (isinstance(result, tuple | list) and len(result) == 2):
        raise SpecError("workload.factory: must return (teacher_blocks, student_blocks), two lists of nn.Module")
    teachers, students = (list(part) for part in result)
    if not teachers or len(teachers) != len(students):
        raise SpecError(
            f"workload.factory: returned {len(teachers)} teacher and {len(students)} student blocks;"
            " they must be equal in number and at least one"
        )
    for index, module in enumerate(teachers + students):
        if not isinstance(module, nn.Module):
            raise SpecError(f"workload.factory: item {index} is a {type(module).__name__}, not an nn.Module")
    names = [f"block{i}" for i in range(len(teachers))]
    return Workload(teacher_blocks=teachers, student_blocks=students, block_names=names)
