"""Student blocks on a rank: flat gradient buffers, plain BatchNorm when trained alone, the two optimiser rounds.

Tier: pure logic, CPU (one single-process gloo group where a process group is needed).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from pipebd_core.rank.batchnorm import with_sync_batchnorm
from pipebd_core.rank.students import FlatGradients, StudentBlock
from pipebd_core.spec import parse_spec
from pipebd_core.workloads.workload import build_workload
from tests.ranks.test_nas import nas_document


@pytest.fixture
def single_process_group(tmp_path: Path) -> Iterator[None]:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_gradients_accumulate_into_one_flat_buffer() -> None:
    layer = nn.Linear(3, 2)
    buffers = FlatGradients(list(layer.parameters()), torch.device("cpu"))
    layer(torch.ones(4, 3)).sum().backward()
    assert buffers.flat.numel() == 8 and buffers.flat.abs().sum() > 0
    assert layer.weight.grad is not None and layer.weight.grad.data_ptr() == buffers.flat.data_ptr()
    buffers.zero()
    assert layer.weight.grad.abs().sum() == 0


def test_a_block_trained_alone_keeps_its_plain_batchnorm(single_process_group: None) -> None:
    block = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4), nn.ReLU())
    for device in (torch.device("cpu"), torch.device("cuda", 0)):
        assert with_sync_batchnorm(block, None, device) is block  # no gradient group
        assert with_sync_batchnorm(block, dist.group.WORLD, device) is block  # a group of one rank
    assert isinstance(block[1], nn.BatchNorm2d)  # split rows: tests/ranks/test_batchnorm.py, in groups of 2 ranks


def test_weight_and_architecture_rounds_update_disjoint_parameters() -> None:
    spec = parse_spec(nas_document())
    workload = build_workload(spec)
    student = StudentBlock(1, workload.student_blocks[1], "mse", spec, workload.search, torch.device("cpu"))
    x, target = torch.randn(4, 8, 16, 16), torch.randn(4, 8, 8, 8)  # block 1: 8 channels, stride 2
    before = {name: p.detach().clone() for name, p in student.module.named_parameters()}

    def changed() -> set[str]:
        return {n for n, p in student.module.named_parameters() if not torch.equal(p.detach(), before[n])}

    student.begin(0, "arch")
    student.loss(x, target).backward()
    student.update("arch", 0.1)
    assert changed() and all(name.endswith("alpha") for name in changed())
    before = {name: p.detach().clone() for name, p in student.module.named_parameters()}
    student.begin(1, "weights")
    student.loss(x, target).backward()
    student.update("weights", 0.1)
    assert changed() and not any(name.endswith("alpha") for name in changed())
