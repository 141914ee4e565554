"""The VGG compression workload: block shapes, seeding, loading teacher weights, assembly.

tier: pure logic, CPU
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torchvision
from torch import nn
from torchvision.models import VGG

from pipebd_core.spec import SpecError, parse_spec
from pipebd_core.workloads.workload import Workload, build_workload


def build(seed: int = 0, num_classes: int = 10, **workload: Any) -> Workload:
    document = {"workload": workload, "train": {"seed": seed}, "data": {"num_classes": num_classes}}
    return build_workload(parse_spec(document))


def weights_of(blocks: list[nn.Module]) -> list[torch.Tensor]:
    return [t for block in blocks for t in block.state_dict().values()]


def conv(block: nn.Module, index: int = 0) -> torch.Tensor:
    """The weight of the block's index-th Conv2d."""
    return [m for m in block.modules() if isinstance(m, nn.Conv2d)][index].weight


def same(a: list[nn.Module], b: list[nn.Module]) -> bool:
    wa, wb = weights_of(a), weights_of(b)
    return len(wa) == len(wb) and all(torch.equal(x, y) for x, y in zip(wa, wb, strict=True))


@pytest.mark.parametrize(("batch", "size", "final"), [(2, 32, (2, 512, 1, 1)), (1, 224, (1, 512, 7, 7))])
def test_vgg16_layer_blocks_chain_and_students_fit(batch: int, size: int, final: tuple[int, ...]) -> None:
    workload = build(teacher="vgg16")
    assert workload.num_blocks == 13 and len(workload.student_blocks) == 13
    assert workload.block_names[:3] == ["conv1_1", "conv1_2", "conv2_1"]
    assert workload.block_names[-1] == "conv5_3"
    x = torch.randn(batch, 3, size, size)
    with torch.no_grad():
        for teacher, student in zip(workload.teacher_blocks, workload.student_blocks, strict=True):
            y = teacher(x)
            assert student(x).shape == y.shape
            x = y
    assert tuple(x.shape) == final
    assert any("randomly initialised" in w and "teacher_weights" in w for w in workload.warnings)


def test_stage_granularity_and_batch_norm() -> None:
    stages = build(teacher="vgg16", granularity="stage")
    assert stages.block_names == ["stage1", "stage2", "stage3", "stage4", "stage5"]
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        for teacher, student in zip(stages.teacher_blocks, stages.student_blocks, strict=True):
            assert isinstance(list(teacher.children())[-1], nn.MaxPool2d)
            y = teacher(x)
            assert student(x).shape == y.shape
            x = y
    assert tuple(x.shape) == (2, 512, 1, 1)
    bn = build(teacher="vgg16_bn")
    assert bn.num_blocks == 13
    assert all(any(isinstance(m, nn.BatchNorm2d) for m in b.modules()) for b in bn.teacher_blocks)
    plain = build(teacher="vgg16")
    assert not any(isinstance(m, nn.BatchNorm2d) for b in plain.teacher_blocks for m in b.modules())


def test_seeding_is_reproducible_and_leaves_global_rng_alone() -> None:
    state = torch.get_rng_state()
    first, again, other = build(seed=1), build(seed=1), build(seed=2)
    assert torch.equal(state, torch.get_rng_state())
    assert same(first.teacher_blocks, again.teacher_blocks)
    assert same(first.student_blocks, again.student_blocks)
    for one, two in zip(first.teacher_blocks, other.teacher_blocks, strict=True):
        assert not torch.equal(conv(one), conv(two))
    for one, two in zip(first.student_blocks, other.student_blocks, strict=True):
        assert not torch.equal(conv(one), conv(two))
        assert not torch.equal(conv(one, 1), conv(two, 1))


def test_each_block_is_seeded_independently_of_the_others() -> None:
    vgg11, vgg13, vgg16 = build(teacher="vgg11"), build(teacher="vgg13"), build(teacher="vgg16")
    # vgg13 and vgg16 share conv1_1..conv3_1; vgg11's block 7 (conv5_2) and vgg13's block 7 (conv4_2)
    # are both 512->512 convs after different earlier blocks: equal only if seeded per block.
    assert same(vgg13.teacher_blocks[:5], vgg16.teacher_blocks[:5])
    assert same(vgg13.student_blocks[:5], vgg16.student_blocks[:5])
    assert torch.equal(conv(vgg11.teacher_blocks[7]), conv(vgg13.teacher_blocks[7]))
    assert same([vgg11.student_blocks[7].get_submodule("0")], [vgg13.student_blocks[7]])
    assert not torch.equal(conv(vgg11.teacher_blocks[6]), conv(vgg11.teacher_blocks[7]))


def test_assemble_gives_logits_at_32() -> None:
    workload = build(teacher="vgg11", num_classes=7)
    assert workload.assemble is not None
    net = workload.assemble(workload.student_blocks)
    assert net.get_submodule("features.0") is workload.student_blocks[0]
    with torch.no_grad():
        assert net(torch.randn(2, 3, 32, 32)).shape == (2, 7)


@pytest.fixture(scope="module")
def saved_vgg16_bn(tmp_path_factory: pytest.TempPathFactory) -> tuple[VGG, Path]:
    torch.manual_seed(123)
    model = torchvision.models.vgg16_bn(num_classes=10)
    for m in model.modules():  # non-trivial BN statistics and affine parameters
        if isinstance(m, nn.BatchNorm2d):
            m.get_buffer("running_mean").uniform_(-0.5, 0.5)
            m.get_buffer("running_var").uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.1, 0.1)
    path = tmp_path_factory.mktemp("weights") / "vgg16_bn.pth"
    torch.save(model.state_dict(), path)
    return model.eval(), path


def test_teacher_weights_are_loaded(saved_vgg16_bn: tuple[VGG, Path]) -> None:
    model, path = saved_vgg16_bn
    workload = build(teacher="vgg16_bn", teacher_weights=str(path), num_classes=5)
    assert not any("randomly initialised" in w for w in workload.warnings)
    assert any("10-class head" in w for w in workload.warnings)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        y = x
        for block in workload.teacher_blocks:
            y = block(y)
        torch.testing.assert_close(y, model.features(x), rtol=0, atol=0)
        assert workload.teacher_network is not None and workload.assemble is not None
        torch.testing.assert_close(workload.teacher_network()(x), model(x))
        assert workload.assemble(workload.student_blocks)(x).shape == (2, 10)


def test_wrong_architecture_is_named(saved_vgg16_bn: tuple[VGG, Path]) -> None:
    _, path = saved_vgg16_bn
    with pytest.raises(SpecError, match=r"missing key 'features\.2\.weight'.*torchvision vgg16 state_dict"):
        build(teacher="vgg16", teacher_weights=str(path))
    with pytest.raises(SpecError, match=r"missing key 'features\.23\.weight'.*vgg19_bn"):
        build(teacher="vgg19_bn", teacher_weights=str(path))


def test_bad_files_give_spec_errors(tmp_path: Path) -> None:
    missing = tmp_path / "nope.pth"
    with pytest.raises(SpecError, match=r"workload\.teacher_weights: file not found: .*nope\.pth"):
        build(teacher_weights=str(missing))
    wrong_shape = tmp_path / "shape.pth"
    torch.save({"features.0.weight": torch.zeros(64, 3, 5, 5)}, wrong_shape)
    with pytest.raises(SpecError, match=r"'features\.0\.weight' has shape \(64, 3, 5, 5\), vgg16 needs"):
        build(teacher_weights=str(wrong_shape))
    pickled = tmp_path / "model.pth"
    torch.save(nn.Linear(2, 2), pickled)
    with pytest.raises(SpecError, match=r"cannot load .* as a state_dict"):
        build(teacher_weights=str(pickled))
