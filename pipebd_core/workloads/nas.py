"""NAS workload: a MobileNetV2 teacher and ProxylessNAS-style supernet students, searched block by block.

The teacher's features are cut at its stage boundaries (default: stem with the 16- and 24-channel
stages; 32; 64; 96; 160; 320 with the head), six blocks as in DNA and Pipe-BD. Below 96x96 inputs the
stem conv and the 24-channel stage run at stride 1 (the paper's CIFAR-10 setting: stage strides
1,2,2,1,2,1). Each student block is a supernet whose searchable layers (`layers_per_block`) go from
the teacher block's input width to its output width with the same total stride; block 0 keeps a
fixed stem and the last block a fixed head, so its output is logits like the teacher's.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torchvision.models import MobileNetV2

from pipebd_core.documents.architecture import Architecture, ArchitectureBlock
from pipebd_core.documents.profile import Profile
from pipebd_core.spec import Spec, SpecError
from pipebd_core.workloads.loading import read_state_dict, uninitialised
from pipebd_core.workloads.supernet import MixedLayer, SupernetBlock, init_supernet, norm_layer, soft_cross_entropy
from pipebd_core.workloads.workload import Workload, search_settings, seeded

BLOCK_STARTS = (0, 4, 7, 11, 14, 17)  # feature indices where blocks begin (options.block_starts overrides)
CIFAR_BELOW = 96  # inputs smaller than this use the stride-1 stem and 24-stage
_FIELD = "workload.teacher_weights"

__all__ = ["build_nas_workload", "soft_cross_entropy"]


def init_mobilenet(module: nn.Module, generator: torch.Generator) -> None:
    """torchvision's MobileNetV2 initialisation rule, drawn from `generator`."""
    for m in module.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", generator=generator)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.BatchNorm2d):
            m.reset_parameters()
        elif isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0, 0.01, generator=generator)
            nn.init.zeros_(m.bias)


def _teacher(spec: Spec) -> tuple[MobileNetV2, list[str]]:
    """The whole MobileNetV2, loaded from teacher_weights or left for seeded per-block initialisation."""
    w = spec.workload
    weights = read_state_dict(w.teacher_weights, _FIELD) if w.teacher_weights else None
    classes = int(weights["classifier.1.weight"].shape[0]) if weights and "classifier.1.weight" in weights else None
    net = uninitialised(lambda: MobileNetV2(num_classes=classes or spec.data.num_classes, width_mult=w.width_mult))
    warnings = []
    if weights is None:
        warnings.append(
            "the mobilenet_v2 teacher is randomly initialised (seeded), so the search mimics random features;"
            f" set {_FIELD} to a torchvision-format mobilenet_v2 state_dict for a real teacher"
        )
    else:
        try:
            net.load_state_dict(weights)
        except RuntimeError as error:
            first = str(error).splitlines()[1].strip() if len(str(error).splitlines()) > 1 else str(error)
            raise SpecError(
                f"{_FIELD}: not a torchvision mobilenet_v2 state_dict with width_mult {w.width_mult}: {first}"
            ) from None
    if spec.data.image_size < CIFAR_BELOW:
        net.features[0][0].stride = (1, 1)
        net.features[2].conv[1][0].stride = (1, 1)  # first depthwise conv of the 24-channel stage
    return net, warnings


def _teacher_blocks(net: MobileNetV2, starts: Sequence[int]) -> list[nn.Sequential]:
    bounds = [*starts, len(net.features)]
    blocks = [nn.Sequential(*net.features[a:b]) for a, b in itertools.pairwise(bounds)]
    blocks[-1].extend([nn.AdaptiveAvgPool2d(1), nn.Flatten(1), net.classifier])
    return blocks


def _shapes(blocks: list[nn.Sequential], image_size: int) -> list[torch.Size]:
    x = torch.zeros(1, 3, image_size, image_size)
    shapes = [x.shape]
    with torch.no_grad():
        for block in blocks:
            x = block.eval()(x)
            shapes.append(x.shape)
    return shapes


def _stem(net: MobileNetV2, norm: bool) -> list[nn.Module]:
    """Block 0's fixed part: the stem conv and the expansion-1 layer, as in the teacher."""
    stem, first = net.features[0][0], net.features[1]
    width, out = stem.out_channels, first.out_channels
    return [
        nn.Conv2d(3, width, 3, stem.stride, 1, bias=not norm),
        norm_layer(width, norm),
        nn.ReLU6(),
        nn.Conv2d(width, width, 3, 1, 1, groups=width, bias=not norm),
        norm_layer(width, norm),
        nn.ReLU6(),
        nn.Conv2d(width, out, 1, bias=not norm),
        norm_layer(out, norm),
    ]


def _head(net: MobileNetV2, norm: bool) -> list[nn.Module]:
    """The last block's fixed part: 1x1 conv to the head width, pooling, classifier."""
    last = net.features[-1]
    linear = net.classifier[1]
    return [
        nn.Conv2d(last[0].in_channels, last.out_channels, 1, bias=not norm),
        norm_layer(last.out_channels, norm),
        nn.ReLU6(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(1),
        nn.Linear(linear.in_features, linear.out_features),
    ]


def _block_geometry(net: MobileNetV2, shapes: list[torch.Size]) -> list[tuple[int, int, int]]:
    """(input width, output width, stride) of each block's searchable layers, read off the teacher."""
    count = len(shapes) - 1
    geometry = []
    for index in range(count):
        last = index == count - 1
        cin = net.features[1].out_channels if index == 0 else int(shapes[index][1])
        cout = net.features[-1][0].in_channels if last else int(shapes[index + 1][1])
        stride = _last_stride(net, shapes[index]) if last else int(shapes[index][2]) // int(shapes[index + 1][2])
        if index == 0:
            stride //= net.features[0][0].stride[0]
        geometry.append((cin, cout, max(1, stride)))
    return geometry


def _student(net: MobileNetV2, index: int, geometry: list[tuple[int, int, int]], spec: Spec) -> SupernetBlock:
    """Supernet block `index`: stem or head where needed, then its searchable layers."""
    w, norm = spec.workload, spec.workload.student_norm == "batch"
    cin, cout, stride = geometry[index]
    prefix = _stem(net, norm) if index == 0 else []
    suffix = _head(net, norm) if index == len(geometry) - 1 else []
    layers = [
        MixedLayer(cin if i == 0 else cout, cout, stride if i == 0 else 1, norm, w.gates)
        for i in range(w.layers_per_block[index])
    ]
    return SupernetBlock(prefix, layers, suffix)


def _last_stride(net: MobileNetV2, shape: torch.Size) -> int:
    """The stride of the last block's features (before pooling), from a probe."""
    x = torch.zeros(1, *shape[1:])
    with torch.no_grad():
        y = net.features[-2:].eval()(x)
    return int(shape[2]) // int(y.shape[2])


def _derive(blocks: Sequence[nn.Module], _profile: Profile | None = None) -> tuple[Architecture, nn.Module]:
    names, modules = [], []
    for block in blocks:
        assert isinstance(block, SupernetBlock)
        chosen, module = block.derive()
        names.append(chosen)
        modules.append(module)
    architecture = Architecture(blocks=[ArchitectureBlock(block=i, layers=layers) for i, layers in enumerate(names)])
    return architecture, nn.Sequential(*modules).eval()


def _block_starts(value: Any) -> tuple[int, ...]:
    """Where blocks begin among MobileNetV2's 19 feature modules (0: stem conv, 1-17: inverted
    residuals, 18: head conv). Block 0 holds the stem and the first layer, the last block the head."""
    last_start = 17
    ok = isinstance(value, list | tuple) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    starts = tuple(value) if ok else ()
    if (
        len(starts) < 2
        or starts[0] != 0
        or any(b <= a for a, b in itertools.pairwise(starts))
        or starts[1] < 2
        or starts[-1] > last_start
    ):
        raise SpecError(
            f"workload.options.block_starts: {value!r} is not a split of MobileNetV2's features; give two or"
            " more increasing feature indices starting at 0, the second at least 2 (block 0 holds the stem and"
            f" the first layer) and the last at most {last_start} (the last block holds the head),"
            f" e.g. {list(BLOCK_STARTS)}"
        )
    return starts


def build_nas_workload(spec: Spec) -> Workload:
    w, seed = spec.workload, spec.train.seed
    starts = _block_starts(w.options.get("block_starts", BLOCK_STARTS))
    if len(starts) != len(w.layers_per_block):
        raise SpecError(
            f"workload.layers_per_block has {len(w.layers_per_block)} entries but the teacher is cut into"
            f" {len(starts)} blocks (options.block_starts {list(starts)}); give one count per block"
        )
    net, warnings = _teacher(spec)
    teachers = _teacher_blocks(net, starts)
    if w.teacher_weights is None:
        for i, block in enumerate(teachers):
            init_mobilenet(block, seeded(seed, "teacher", i))
    geometry = _block_geometry(net, _shapes(teachers, spec.data.image_size))
    students: list[nn.Module] = []
    for i in range(len(teachers)):
        student = uninitialised(functools.partial(_student, net, i, geometry, spec))
        init_supernet(student, seeded(seed, "student", i))
        students.append(student)
    losses = [spec.train.loss] * (len(teachers) - 1) + ["soft_ce" if w.final_loss == "ce" else "mse"]
    search = search_settings(spec)
    names = [f"block{i}" for i in range(len(teachers))]
    return Workload(
        teacher_blocks=list(teachers),
        student_blocks=students,
        block_names=names,
        warnings=warnings,
        losses=losses,
        search=search,
        derive=_derive,
        teacher_network=lambda: nn.Sequential(*teachers).eval(),
    )
