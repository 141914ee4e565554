"""A small BatchNorm workload for the equivalence tests: VGG-like conv stages (3x3 conv, BatchNorm, ReLU,
2x2 max-pool) as teacher blocks and the compression workload's depthwise-separable students (DSConv:
3x3 depthwise, BatchNorm, ReLU, 1x1 pointwise, BatchNorm, ReLU). The students are what the compression
workload trains, without VGG's 100M-weight classifier to build and save on every run.
"""

from __future__ import annotations

from torch import nn

from pipebd_core.workloads.compression import DSConv


def make_bn_blocks(widths: tuple[int, ...] = (8, 16, 16, 32)) -> tuple[list[nn.Module], list[nn.Module]]:
    teachers: list[nn.Module] = []
    students: list[nn.Module] = []
    width_in = 3
    for width in widths:
        conv = nn.Conv2d(width_in, width, 3, padding=1)
        teachers.append(nn.Sequential(conv, nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(2)))
        students.append(nn.Sequential(DSConv(width_in, width), nn.MaxPool2d(2)))
        width_in = width
    return teachers, students
