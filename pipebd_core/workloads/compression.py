"""Compression workload: distil a torchvision VGG into depthwise-separable students, block by block.

Teacher blocks are slices of VGG's `features` (one per conv layer, or one per pooling stage); each
student block replaces every 3x3 conv with a depthwise 3x3 + pointwise 1x1 pair of the same output
shape. The 120M-parameter classifier head is only built when `assemble` or `teacher_network` runs.
Modules are created on the meta device and then initialised from per-block generators, so building
a workload neither depends on nor advances the global RNG.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn
from torchvision.models.vgg import VGG, cfgs, make_layers

from pipebd_core.spec import Spec, SpecError
from pipebd_core.workloads.loading import init_default, read_state_dict, uninitialised
from pipebd_core.workloads.workload import Workload, seeded

VGG_CONFIGS = {"vgg11": "A", "vgg13": "B", "vgg16": "D", "vgg19": "E"}
_FIELD = "workload.teacher_weights"


class DSConv(nn.Sequential):
    """Depthwise-separable stand-in for a 3x3 conv + ReLU: same output shape, far fewer weights."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__(
            nn.Conv2d(cin, cin, 3, padding=1, groups=cin, bias=False),
            nn.BatchNorm2d(cin),
            nn.ReLU(),
            nn.Conv2d(cin, cout, 1, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU(),
        )


def init_vgg(module: nn.Module, g: torch.Generator) -> None:
    """torchvision's VGG initialisation rule, drawn from `g`."""
    for m in module.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu", generator=g)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.BatchNorm2d):
            m.reset_parameters()  # weight 1, bias 0, fresh running statistics
        elif isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0, 0.01, generator=g)
            nn.init.zeros_(m.bias)


def _split(features: nn.Sequential, by_stage: bool) -> tuple[list[nn.Sequential], list[str]]:
    """Cut VGG features into blocks: conv[, bn], relu[, pool] per layer, or everything up to each pool."""
    layers: list[list[nn.Module]] = []
    names: list[str] = []
    stage, index = 1, 1
    for module in features:
        if isinstance(module, nn.Conv2d):
            layers.append([module])
            names.append(f"conv{stage}_{index}")
            index += 1
        else:
            layers[-1].append(module)
            if isinstance(module, nn.MaxPool2d):
                stage, index = stage + 1, 1
    if not by_stage:
        return [nn.Sequential(*layer) for layer in layers], names
    stages: list[nn.Sequential] = []
    current: list[nn.Module] = []
    for layer in layers:
        current += layer
        if isinstance(layer[-1], nn.MaxPool2d):
            stages.append(nn.Sequential(*current))
            current = []
    return stages, [f"stage{i + 1}" for i in range(len(stages))]


def _student(teacher: nn.Module, g: torch.Generator) -> nn.Sequential:
    """The depthwise-separable replacement of one teacher block, same pools, seeded from `g`."""

    def build() -> nn.Sequential:
        parts: list[nn.Module] = []
        for m in teacher.children():
            if isinstance(m, nn.Conv2d):
                parts.append(DSConv(m.in_channels, m.out_channels))
            elif isinstance(m, nn.MaxPool2d):
                parts.append(nn.MaxPool2d(kernel_size=m.kernel_size, stride=m.stride))
        return nn.Sequential(*parts)

    block = uninitialised(build)
    init_default(block, g)
    return block


def _check_state_dict(state: Mapping[str, torch.Tensor], features: nn.Module, teacher: str) -> int:
    """Raise SpecError at the first key or shape that does not fit `teacher`; return its class count."""
    last = state.get("classifier.6.weight")
    num_classes = int(last.shape[0]) if last is not None and last.dim() == 2 else 1
    with torch.device("meta"):
        head = VGG(nn.Sequential(), num_classes=num_classes, init_weights=False)
    expected = {f"features.{k}": v.shape for k, v in features.state_dict().items()}
    expected.update({k: v.shape for k, v in head.state_dict().items()})
    wanted = f"expected a torchvision {teacher} state_dict (features.* and classifier.*)"
    for key, shape in expected.items():
        if key not in state:
            if key.endswith("num_batches_tracked"):
                continue  # older torchvision checkpoints lack it
            raise SpecError(f"{_FIELD}: missing key {key!r}; {wanted}")
        if state[key].shape != shape:
            got = tuple(state[key].shape)
            raise SpecError(f"{_FIELD}: {key!r} has shape {got}, {teacher} needs {tuple(shape)}; {wanted}")
    for key in state:
        if key not in expected:
            raise SpecError(f"{_FIELD}: unexpected key {key!r}; {wanted}")
    return num_classes


def _load_features(features: nn.Sequential, path: str, teacher: str) -> int:
    """Load the features.* part of the checkpoint; return the head's number of classes."""
    state = read_state_dict(path, _FIELD)
    num_classes = _check_state_dict(state, features, teacher)
    for m in features.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.reset_running_stats()  # in case the checkpoint has no num_batches_tracked
    part = {k.removeprefix("features."): v for k, v in state.items() if k.startswith("features.")}
    features.load_state_dict(part, strict=False)  # every other key was checked above
    return num_classes


def _network(blocks: Sequence[nn.Module], num_classes: int, weights: str | None, seed: int) -> VGG:
    """blocks as `features` plus VGG's avgpool and classifier (loaded or seeded), in eval mode."""
    net = uninitialised(lambda: VGG(nn.Sequential(), num_classes=num_classes, init_weights=False))
    if weights is None:
        init_vgg(net.classifier, seeded(seed, "head", 0))
    else:
        state = read_state_dict(weights, _FIELD)
        part = {k.removeprefix("classifier."): v for k, v in state.items() if k.startswith("classifier.")}
        net.classifier.load_state_dict(part)
    net.features = nn.Sequential(*blocks)
    return net.eval()


def build_compression_workload(spec: Spec) -> Workload:
    """VGG teacher blocks, depthwise-separable students, and the head for reports (built lazily)."""
    w, seed, weights = spec.workload, spec.train.seed, spec.workload.teacher_weights
    arch, batch_norm = w.teacher.removesuffix("_bn"), w.teacher.endswith("_bn")
    features = uninitialised(lambda: make_layers(cfgs[VGG_CONFIGS[arch]], batch_norm=batch_norm))
    warnings: list[str] = []
    if weights is None:
        num_classes = spec.data.num_classes
        warnings.append(
            f"the {w.teacher} teacher is randomly initialised (seeded), so the students mimic random"
            f" features and top-1 is meaningless; set {_FIELD} to a torchvision-format {w.teacher}"
            " state_dict for a real teacher"
        )
    else:
        num_classes = _load_features(features, weights, w.teacher)
        if num_classes != spec.data.num_classes:
            warnings.append(
                f"{_FIELD} has a {num_classes}-class head but data.num_classes is {spec.data.num_classes};"
                " top-1 compares the head's class indices with the data's labels as they are"
            )
    teachers, names = _split(features, w.granularity == "stage")
    if weights is None:
        for i, block in enumerate(teachers):
            init_vgg(block, seeded(seed, "teacher", i))
    students = [_student(block, seeded(seed, "student", i)) for i, block in enumerate(teachers)]
    return Workload(
        teacher_blocks=list(teachers),
        student_blocks=list(students),
        block_names=names,
        assemble=lambda blocks: _network(blocks, num_classes, weights, seed),
        teacher_network=lambda: _network(teachers, num_classes, weights, seed),
        warnings=warnings,
    )
