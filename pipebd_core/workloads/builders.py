"""Which modules build a spec's workload, its network and its data set, by name, known without importing
any of them (nor torch): what a warm agent server imports before it forks a job's processes
(`rank.process.preload`), and what the launch names for it (job/launch.py), from a supervisor that never
imports torch itself.
"""

from __future__ import annotations

from pipebd_core.spec import Spec

# The module and builder of each workload kind, imported only for a spec of that kind (torchvision and
# transformers cost seconds to import); every other kind is a custom factory.
BUILDERS = {
    "compression": ("pipebd_core.workloads.compression", "build_compression_workload"),
    "nas": ("pipebd_core.workloads.nas", "build_nas_workload"),
    "transformer": ("pipebd_core.workloads.transformer", "build_transformer_workload"),
}
CUSTOM_BUILDER = ("pipebd_core.workloads.custom", "build_custom_workload")

# The data sets built by a module of their own, imported only when a spec names them (torchvision costs
# a second to import); `build(spec, split)` in each.
DATASET_MODULES = {
    "digits": "pipebd_core.data.digits",
    "cifar10": "pipebd_core.data.images",
    "imagefolder": "pipebd_core.data.images",
    "text": "pipebd_core.data.text",
}


def workload_module(spec: Spec) -> str:
    """The module that builds the spec's workload."""
    return BUILDERS.get(spec.workload.kind, CUSTOM_BUILDER)[0]


def dataset_module(spec: Spec) -> str | None:
    """The module that builds the spec's data set, if it has one of its own."""
    return DATASET_MODULES.get(spec.data.dataset)


def warm_modules(spec: Spec) -> list[str]:
    """What building `spec`'s workload and data set imports (torchvision, transformers: a second of CPU or
    more each), by module name, without importing it: the workload's builder, the network a `train` job
    builds, the data set's module."""
    w = spec.workload
    if w.kind != "train" or w.factory is not None:
        network = None
    else:  # what network_to_train builds: a language model of a config, or a torchvision classifier
        network = "transformers" if w.config is not None else "torchvision.models"
    return [module for module in (workload_module(spec), network, dataset_module(spec)) if module is not None]
