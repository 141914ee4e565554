"""A torchvision ResNet-18 cut into its residual blocks, each with a depthwise-separable student (a custom
workload's factory: `workload.factory: "pipebd_core.workloads.resnet:make_blocks"`).

The teacher is torchvision's `resnet18` with its own initialisation (random: no weights are read), cut
where its residual stream passes from one BasicBlock to the next: the stem (convolution, BatchNorm, ReLU,
max-pooling), the eight BasicBlocks of layer1..layer4, and the head (average pooling, the classifier).
Each student keeps its teacher block's shape (channels in and out, stride) with every 3x3 convolution
replaced by a depthwise 3x3 and a pointwise 1x1, and a 1x1 shortcut where the teacher has a downsample.
It is a held-out network for the cost models (docs/benchmarks.md): none of them was changed for it.
"""

from __future__ import annotations

from torch import Tensor, nn


def _separable(width_in: int, width_out: int, stride: int) -> list[nn.Module]:
    return [
        nn.Conv2d(width_in, width_in, 3, stride=stride, padding=1, groups=width_in, bias=False),
        nn.Conv2d(width_in, width_out, 1, bias=False),
        nn.BatchNorm2d(width_out),
    ]


class SeparableBasicBlock(nn.Module):
    """A BasicBlock's shape (two 3x3 convolutions and a residual) with depthwise-separable convolutions."""

    def __init__(self, width_in: int, width_out: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            *_separable(width_in, width_out, stride), nn.ReLU(inplace=True), *_separable(width_out, width_out, 1)
        )
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or width_in != width_out:
            self.shortcut = nn.Sequential(
                nn.Conv2d(width_in, width_out, 1, stride=stride, bias=False), nn.BatchNorm2d(width_out)
            )
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: Tensor) -> Tensor:
        return self.relu(self.body(x) + self.shortcut(x))


def make_blocks(num_classes: int = 10) -> tuple[list[nn.Module], list[nn.Module]]:
    """ResNet-18's stem, its eight BasicBlocks and its head as teacher blocks; their students."""
    from torchvision.models import resnet18

    teacher = resnet18(num_classes=num_classes)
    stem = nn.Sequential(teacher.conv1, teacher.bn1, teacher.relu, teacher.maxpool)
    residual = [block for layer in (teacher.layer1, teacher.layer2, teacher.layer3, teacher.layer4) for block in layer]
    head = nn.Sequential(teacher.avgpool, nn.Flatten(1), teacher.fc)
    students: list[nn.Module] = [
        nn.Sequential(*_separable(3, 64, 2), nn.ReLU(inplace=True), nn.MaxPool2d(3, stride=2, padding=1))
    ]
    for block in residual:
        width_in, width_out = block.conv1.in_channels, block.conv2.out_channels
        students.append(SeparableBasicBlock(width_in, width_out, block.conv1.stride[0]))
    students.append(nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(1), nn.Linear(512, num_classes)))
    return [stem, *residual, head], students
