"""A tiny BN-free workload: small conv teacher blocks and 1x1-conv students.

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
