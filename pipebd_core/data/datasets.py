"""Data sets: every item is `(input, label)`; synthetic, digits, CIFAR-10, ImageFolder, text or a user's factory.

Nothing is ever downloaded: missing data raises `SpecError` naming the path looked at.
"""

from __future__ import annotations

import hashlib
import importlib
from typing import Any

import torch
from torch.utils.data import Dataset

from pipebd_core.imports import call_factory
from pipebd_core.spec import Spec, SpecError
from pipebd_core.workloads.builders import DATASET_MODULES

Sample = tuple[torch.Tensor, Any]


def mix_seed(*parts: object) -> int:
    """A 63-bit seed from the parts; unlike `seed * k + i`, distinct parts never collide in practice."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class SyntheticDataset(Dataset[Sample]):
    """Gaussian images; sample i depends only on (seed, split, i), so it is generated on demand."""

    def __init__(self, length: int, image_size: int, num_classes: int, seed: int, split: str) -> None:
        self.length, self.image_size, self.num_classes = length, image_size, num_classes
        self.seed, self.split = seed, split

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> Sample:
        if not 0 <= index < self.length:
            raise IndexError(f"synthetic index {index} out of range [0, {self.length})")
        generator = torch.Generator().manual_seed(mix_seed(self.seed, self.split, index))
        image = torch.randn(3, self.image_size, self.image_size, generator=generator)
        label = int(torch.randint(self.num_classes, (1,), generator=generator))
        return image, label


class _Pairs(Dataset[Sample]):
    """Wraps a custom data set so that every item is `(input, label)`; bare tensors get label -1."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: int) -> Sample:
        item = self.inner[index]
        if isinstance(item, torch.Tensor):
            return item, -1
        if isinstance(item, tuple | list) and len(item) == 2 and isinstance(item[0], torch.Tensor):
            return item[0], item[1]
        kind = type(item).__name__
        raise SpecError(f"data.factory: item {index} is a {kind}; expected (tensor, label) or a tensor")


def _custom(spec: Spec) -> Dataset[Sample]:
    inner = call_factory(str(spec.data.factory), "data.factory", spec.data.options)
    if not (hasattr(inner, "__getitem__") and hasattr(inner, "__len__")):
        raise SpecError(f"data.factory returned {type(inner).__name__}; expected a Dataset with __len__")
    return _Pairs(inner)


def build_dataset(spec: Spec, split: str = "train") -> Dataset[Sample]:
    """The data set for `split` ("train" or "eval"); items are `(input_tensor, label)`."""
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    data = spec.data
    if data.dataset == "synthetic":
        length = data.num_samples if split == "train" else min(data.eval_samples, data.num_samples)
        return SyntheticDataset(length, data.image_size, data.num_classes, spec.train.seed, split)
    if data.dataset in DATASET_MODULES:
        dataset: Dataset[Sample] = importlib.import_module(DATASET_MODULES[data.dataset]).build(spec, split)
        return dataset
    return _custom(spec)


def check_dataset(spec: Spec) -> int:
    """Validate the data source (without decoding images); return the number of training samples."""
    count = len(build_dataset(spec, "train"))  # type: ignore[arg-type]
    if count == 0:
        raise SpecError(f"data: the {spec.data.dataset} training set (root {spec.data.root}) is empty")
    return count
