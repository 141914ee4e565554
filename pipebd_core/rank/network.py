"""What the `finetune` phase trains, as a list of layers that run one after another.

    compression   the assembled compressed network: the teacher with its conv blocks replaced by the
                  distilled students (init: distilled), or by freshly initialised ones (init: scratch)
    nas           the searched network from searched_model.pt, or the same architecture re-initialised
                  (init: scratch, DNA's retraining)
    train         a torchvision classifier (VGG, MobileNetV2, a vision transformer) from a seeded initialisation,
                  a causal language model of workload.config, or the network a
                  `workload.factory` returns (built under a fixed seed)
    custom        the workload's student blocks in order (the last one must produce logits)

`Network.model` keeps the network's own structure (its state_dict is finetuned_model.pt, and for kind
train the torchvision-format teacher.pt); `Network.layers` are the same modules in the order they run,
so a pipeline stage is a contiguous slice of them and `nn.Sequential(*layers)` computes what `model` does.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
from torch import nn

from pipebd_core.imports import call_factory
from pipebd_core.rundir import RunDir
from pipebd_core.spec import Spec, SpecError, parse_spec
from pipebd_core.workloads.loading import uninitialised
from pipebd_core.workloads.workload import block_seed, build_workload, seeded

# torchvision (and the workloads built on it) are imported where a torchvision network is built or taken
# apart: a second of CPU that a rank or an evaluate process of a custom network never needs.


@dataclass
class Network:
    model: nn.Module  # the network in its own structure
    layers: list[nn.Module]  # the same modules in the order they run
    names: list[str]  # one per layer, e.g. "features.3" or "classifier.6"

    def sequential(self, start: int = 0, stop: int | None = None) -> nn.Sequential:
        """Layers [start, stop) as one module (a pipeline stage, or the whole network)."""
        return nn.Sequential(*self.layers[start:stop])

    @property
    def num_layers(self) -> int:
        return len(self.layers)


def layers_of(model: nn.Module, prefix: str = "") -> list[tuple[str, nn.Module]]:
    """(name, module) in the order the network runs them: torchvision VGG and MobileNetV2 spelt out with
    their pooling and flattening, plain nn.Sequential containers opened, anything else one layer."""
    if "torchvision" in sys.modules:  # a torchvision network was built (or loaded) by importing it
        return torchvision_layers(model, prefix) or plain_layers(model, prefix)
    return plain_layers(model, prefix)


def torchvision_layers(model: nn.Module, prefix: str) -> list[tuple[str, nn.Module]] | None:
    """VGG's, MobileNetV2's and VisionTransformer's layers in the order they run, or None for any other."""
    from torchvision.models import VGG, MobileNetV2, VisionTransformer

    if isinstance(model, VGG):
        return [
            *layers_of(model.features, f"{prefix}features."),
            (f"{prefix}avgpool", model.avgpool),
            (f"{prefix}flatten", nn.Flatten(1)),
            *layers_of(model.classifier, f"{prefix}classifier."),
        ]
    if isinstance(model, MobileNetV2):
        return [
            *layers_of(model.features, f"{prefix}features."),
            (f"{prefix}pool", nn.AdaptiveAvgPool2d(1)),
            (f"{prefix}flatten", nn.Flatten(1)),
            *layers_of(model.classifier, f"{prefix}classifier."),
        ]
    if isinstance(model, VisionTransformer):  # the transformer workload's blocks: embedding, layers, head
        from pipebd_core.workloads.vision_transformer import split_vit

        parts = split_vit(model)
        return [
            (f"{prefix}embedding", parts.embedding),
            *((f"{prefix}encoder.layers.{i}", layer) for i, layer in enumerate(parts.layers)),
            (f"{prefix}head", parts.head),
        ]
    return None


def plain_layers(model: nn.Module, prefix: str) -> list[tuple[str, nn.Module]]:
    """Plain nn.Sequential containers opened, anything else one layer."""
    if type(model) is nn.Sequential:
        found: list[tuple[str, nn.Module]] = []
        for name, child in model.named_children():
            found.extend(layers_of(child, f"{prefix}{name}."))
        return found
    return [(prefix.rstrip("."), model)]


def as_network(model: nn.Module) -> Network:
    """`model` as its layers. In-place activations (torchvision's ReLU) are made out of place: a pipeline
    stage's input is a received tensor that autograd needs as it came, and an in-place op on it fails."""
    for module in model.modules():
        if getattr(module, "inplace", False):
            module.inplace = False  # type: ignore[assignment]
    pairs = layers_of(model)
    return Network(model, [module for _, module in pairs], [name for name, _ in pairs])


def network_to_train(spec: Spec) -> nn.Module:
    """kind train: the factory's network, the torchvision one named by workload.teacher, seeded as
    torchvision initialises it, or the causal language model of workload.config."""
    w, classes, seed = spec.workload, spec.data.num_classes, spec.train.seed
    if w.vision_transformer:
        from pipebd_core.workloads.vision_transformer import build_vit

        return build_vit(spec)
    if w.config is not None:
        from pipebd_core.workloads.transformer import language_model_to_train

        return language_model_to_train(spec)
    if w.factory is not None:
        torch.manual_seed(block_seed(seed, "teacher", 0))
        network = call_factory(w.factory, "workload.factory", w.options)
        if not isinstance(network, nn.Module):
            raise SpecError(
                f"workload.factory: kind 'train' needs an nn.Module, {w.factory} returned {type(network).__name__}"
            )
        return network
    from torchvision.models import MobileNetV2
    from torchvision.models.vgg import VGG, cfgs, make_layers

    from pipebd_core.workloads.compression import VGG_CONFIGS, init_vgg
    from pipebd_core.workloads.nas import init_mobilenet

    if w.teacher == "mobilenet_v2":
        net: nn.Module = uninitialised(lambda: MobileNetV2(num_classes=classes, width_mult=w.width_mult))
        init_mobilenet(net, seeded(seed, "teacher", 0))
        return net
    arch, batch_norm = w.teacher.removesuffix("_bn"), w.teacher.endswith("_bn")
    net = uninitialised(
        lambda: VGG(
            make_layers(cfgs[VGG_CONFIGS[arch]], batch_norm=batch_norm), num_classes=classes, init_weights=False
        )
    )
    init_vgg(net, seeded(seed, "teacher", 0))
    return net


def distilled_students(spec: Spec, run_dir: RunDir, fresh: list[nn.Module]) -> list[nn.Module]:
    """The students of student.pt loaded into `fresh` (the workload's own blocks)."""
    from pipebd_core.rank.network import StudentBlocks

    if not run_dir.student.exists():
        raise SpecError(f"finetune.init: 'distilled' needs {run_dir.student}, which the finalize phase writes")
    holder = StudentBlocks(fresh)
    holder.load_state_dict(torch.load(run_dir.student, map_location="cpu", weights_only=True))
    return list(holder.blocks)


def build_network(spec: Spec, run_dir: RunDir | None) -> Network:
    """The network the finetune phase starts from; `run_dir` None: its architecture freshly initialised
    (the preflight's check before any distillation has run)."""
    assert spec.finetune is not None, "only a spec with a finetune section has a network to train"
    kind, distilled = spec.workload.kind, spec.finetune.init == "distilled" and run_dir is not None
    if kind == "train":
        return as_network(network_to_train(spec))
    if kind == "nas":
        return as_network(nas_network(spec, run_dir, distilled).train())
    if kind == "transformer" and len(spec.workload.replacements) > 1:
        return as_network(transformer_search(spec, run_dir if distilled else None).train())
    workload = build_workload(spec)
    students = workload.student_blocks
    if distilled:
        assert run_dir is not None
        students = distilled_students(spec, run_dir, students)
    if workload.assemble is not None:
        return as_network(workload.assemble(students).train())
    return as_network(nn.Sequential(*students).train())


def searched_network(run_dir: RunDir | None) -> nn.Module | None:
    """A search's chosen network as finalize saved it (searched_model.pt); None before the search has run."""
    if run_dir is None or not run_dir.searched_model.exists():
        return None
    searched: nn.Module = torch.load(run_dir.searched_model, map_location="cpu", weights_only=False)
    return searched


def nas_network(spec: Spec, run_dir: RunDir | None, distilled: bool) -> nn.Module:
    """A NAS search's network to fine-tune: the searched one with its distilled weights, or re-initialised
    (init: scratch, DNA's retraining); before the search has run (the preflight's checks) the supernet."""
    searched = searched_network(run_dir)
    if searched is None and distilled:
        assert run_dir is not None
        raise SpecError(f"finetune.init: 'distilled' needs {run_dir.searched_model}, which the finalize phase writes")
    if searched is None:
        return nn.Sequential(*build_workload(spec).student_blocks)  # stands in for the preflight's checks
    if not distilled:
        from pipebd_core.workloads.nas import init_mobilenet

        init_mobilenet(searched, seeded(spec.train.seed, "student", 0))
    return searched


def transformer_search(spec: Spec, run_dir: RunDir | None) -> nn.Module:
    """A transformer search's network to fine-tune: its chosen layers (searched_model.pt), or before the
    search has run (the preflight's checks) the first candidate of every layer, which has the same shapes."""
    searched = searched_network(run_dir)
    if searched is not None:
        return searched
    from pipebd_core.workloads.transformer import first_candidates

    return first_candidates(spec)


def teacher_network(spec: Spec) -> nn.Module | None:
    """The teacher a kd loss and the accuracy report compare with; None for kinds without one."""
    if spec.workload.kind in ("train", "custom"):
        return None
    factory = build_workload(spec).teacher_network
    return factory().eval() if factory is not None else None


def parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


class StudentBlocks(nn.Module):
    """The container whose state_dict is student.pt: keys `blocks.<i>.<param>`."""

    def __init__(self, blocks: list[nn.Module]) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)


def finetune_view(spec: Spec) -> Spec:
    """`spec` with train.* and data.batch_size taken from its finetune section (the seed stays)."""
    tune = spec.finetune
    assert tune is not None, "only a spec with a finetune section is trained end to end"
    document = spec.model_dump(mode="json")
    document["train"].update(
        epochs=tune.epochs,
        max_steps=tune.max_steps,
        lr=tune.lr,
        momentum=tune.momentum,
        weight_decay=tune.weight_decay,
        lr_schedule=tune.lr_schedule,
        checkpoint_every=None,
    )
    document["data"]["batch_size"] = tune.batch_size or spec.data.batch_size
    return parse_spec(document)
