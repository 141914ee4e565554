"""scikit-learn's handwritten digits as an image data set: real labelled data that ships with the package.

1,797 8x8 grey images of the digits 0-9 (no download), scaled to [0, 1], resized to `data.image_size`
(bilinear), repeated to 3 channels and normalised with the training split's mean and spread. The split
is fixed whatever the spec's seed: 80% of a permutation seeded with SPLIT_SEED trains, 20% evaluates,
so an accuracy is always measured on the same held-out images.
"""

from __future__ import annotations

import functools
import gzip
import importlib.util
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from pipebd_core.spec import Spec, SpecError

SPLIT_SEED = 1797
TRAIN_FRACTION = 0.8
CLASSES = 10


def digits_file() -> Path:
    """The digits as scikit-learn ships them (`digits.csv.gz`: 64 pixels 0-16 and the label per row), found
    without importing scikit-learn (a second of CPU in every rank and evaluate process that reads them)."""
    found = importlib.util.find_spec("sklearn")
    if found is None or not found.submodule_search_locations:
        raise SpecError("data.dataset: 'digits' needs scikit-learn, which ships them: pip install scikit-learn")
    return Path(next(iter(found.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"


def read_digits() -> tuple[torch.Tensor, torch.Tensor]:
    """(pixels N x 64 as floats 0-16, labels N): what `sklearn.datasets.load_digits` reads, in its order."""
    with gzip.open(digits_file(), "rt") as rows:
        values = torch.tensor([[float(v) for v in row.split(",")] for row in rows if row.strip()])
    return values[:, :-1], values[:, -1].long()


@functools.lru_cache(maxsize=4)
def _scaled(image_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float, float]:
    """(images N x 1 x S x S in [0, 1], labels, permutation, the training split's mean and spread)."""
    pixels, labels = read_digits()
    images = pixels.reshape(-1, 1, 8, 8) / 16.0
    if image_size != images.shape[-1]:
        images = F.interpolate(images, size=(image_size, image_size), mode="bilinear", align_corners=False)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(SPLIT_SEED))
    train = images[order[: round(TRAIN_FRACTION * len(order))]]
    return images, labels, order, float(train.mean()), float(train.std())


def normalisation(image_size: int) -> tuple[float, float]:
    """The mean and spread every pixel in [0, 1] is normalised with (the training split's at this size)."""
    return _scaled(image_size)[3:]


@functools.lru_cache(maxsize=4)
def _images(image_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(images N x 3 x S x S normalised, labels, permutation) of the whole set at this size."""
    images, labels, order, mean, std = _scaled(image_size)
    images = (images - mean) / std
    return images.expand(-1, 3, -1, -1).contiguous(), labels, order


class Digits(Dataset[tuple[torch.Tensor, int]]):
    def __init__(self, image_size: int, split: str) -> None:
        images, labels, order = _images(image_size)
        cut = round(TRAIN_FRACTION * len(order))
        self.indices = order[:cut] if split == "train" else order[cut:]
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        item = int(self.indices[index])
        return self.images[item], int(self.labels[item])


def build(spec: Spec, split: str) -> Dataset[tuple[torch.Tensor, int]]:
    if spec.data.num_classes != CLASSES:
        raise SpecError(f"data.num_classes: the digits have {CLASSES} classes, got {spec.data.num_classes}; set 10")
    return Digits(spec.data.image_size, split)
