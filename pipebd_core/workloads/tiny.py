"""A tiny BN-free workload: small conv teacher blocks and 1x1-conv students (and, as `make_classifier`,
the same ending in logits, for end-to-end training).

Runs in seconds on any machine; the equivalence tests use it because, without batch statistics,
every execution mode must produce the same students as a plain sequential loop.
"""

from __future__ import annotations

from torch import nn


def make_blocks(
    num_blocks: int = 4, channels: int = 8, in_channels: int = 3
) -> tuple[list[nn.Module], list[nn.Module]]:
    teachers: list[nn.Module] = []
    students: list[nn.Module] = []
    width_in = in_channels
    for index in range(num_blocks):
        width_out = channels * (1 + index % 2)
        stride = 2 if index == num_blocks // 2 else 1
        teachers.append(nn.Sequential(nn.Conv2d(width_in, width_out, 3, stride=stride, padding=1), nn.ReLU()))
        students.append(nn.Sequential(nn.Conv2d(width_in, width_out, 1, stride=stride), nn.Tanh()))
        width_in = width_out
    return teachers, students


def make_classifier(
    num_blocks: int = 4, channels: int = 8, in_channels: int = 3, classes: int = 10
) -> tuple[list[nn.Module], list[nn.Module]]:
    """`make_blocks` whose last block ends in logits (global average pooling and a linear layer), so its
    students assembled in order are a classifier the finetune phase can train end to end."""
    teachers, students = make_blocks(num_blocks, channels, in_channels)
    width = channels * (1 + (num_blocks - 1) % 2)
    for blocks in (teachers, students):
        last = blocks[-1]
        assert isinstance(last, nn.Sequential)
        blocks[-1] = nn.Sequential(*last, nn.AdaptiveAvgPool2d(1), nn.Flatten(1), nn.Linear(width, classes))
    return teachers, students


def make_network(
    num_blocks: int = 4, channels: int = 8, in_channels: int = 3, classes: int = 10, batch_norm: bool = False
) -> nn.Module:
    """`make_classifier`'s teacher blocks as one network (for kind train, and the end-to-end tests); with
    `batch_norm`, a BatchNorm2d after every convolution."""
    teachers, _ = make_classifier(num_blocks, channels, in_channels, classes)
    if batch_norm:
        for block in teachers:
            assert isinstance(block, nn.Sequential) and isinstance(block[0], nn.Conv2d)
            block.insert(1, nn.BatchNorm2d(block[0].out_channels))
    return nn.Sequential(*teachers)
