"""Image data sets read from local folders: CIFAR-10 in its python format, and ImageFolder trees.

Nothing is ever downloaded; a missing or incomplete folder raises SpecError naming the path.
Kept apart from data.py because torchvision takes seconds to import and most ranks never need it.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

from torch.utils.data import Dataset
from torchvision import datasets, transforms

from pipebd_core.data.datasets import Sample
from pipebd_core.spec import Spec, SpecError

CIFAR_FOLDER = "cifar-10-batches-py"
CIFAR_FILES = (*(f"data_batch_{i}" for i in range(1, 6)), "test_batch", "batches.meta")
CIFAR_MEAN, CIFAR_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class _LocalCIFAR10(datasets.CIFAR10):
    """CIFAR10 that checks its files exist instead of their md5 sums.

    torchvision compares every file with the md5 of the official download, so any locally
    written or re-pickled tree (test fixtures, trimmed copies) is rejected as "corrupted", and
    each rank would re-hash ~170 MB at start. We check presence; a damaged pickle still fails
    to load, and `_cifar` turns that into a SpecError naming the file.
    """

    def _check_integrity(self) -> bool:
        return all((Path(self.root) / self.base_folder / name).is_file() for name in CIFAR_FILES)

    def _load_meta(self) -> None:  # the parent re-checks the meta file's md5 here
        with open(Path(self.root) / self.base_folder / self.meta["filename"], "rb") as infile:
            self.classes = pickle.load(infile, encoding="latin1")[self.meta["key"]]
        self.class_to_idx = {name: i for i, name in enumerate(self.classes)}


def _cifar(spec: Spec, split: str) -> Dataset[Sample]:
    root = Path(str(spec.data.root)).expanduser()
    if root.name == CIFAR_FOLDER and not (root / CIFAR_FOLDER).is_dir():
        root = root.parent  # accept the batches folder itself as root
    folder = root / CIFAR_FOLDER
    missing = [name for name in CIFAR_FILES if not (folder / name).is_file()]
    if missing:
        found = f"missing {', '.join(missing)}" if folder.is_dir() else "no such folder"
        raise SpecError(
            f"data.root: CIFAR-10 not found at {folder} ({found}); that folder must hold "
            f"{', '.join(CIFAR_FILES)} (the python version, extracted). Nothing is downloaded."
        )
    steps: list[Any] = [] if spec.data.image_size == 32 else [transforms.Resize(spec.data.image_size)]
    steps += [transforms.ToTensor(), transforms.Normalize(CIFAR_MEAN, CIFAR_STD)]
    try:
        return _LocalCIFAR10(str(root), train=split == "train", transform=transforms.Compose(steps))
    except (pickle.UnpicklingError, EOFError, KeyError, ValueError) as error:
        raise SpecError(f"data.root: CIFAR-10 files under {folder} cannot be read ({error!r})") from None


def _imagefolder(spec: Spec, split: str) -> Dataset[Sample]:
    root = Path(str(spec.data.root)).expanduser()
    if not root.is_dir():
        raise SpecError(f"data.root: image folder {root} does not exist (nothing is downloaded)")
    sub = root / ("train" if split == "train" else "val")
    folder = sub if sub.is_dir() else root
    size = spec.data.image_size
    steps = [transforms.Resize(size), transforms.CenterCrop(size), transforms.ToTensor()]
    transform = transforms.Compose([*steps, transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)])
    try:
        return datasets.ImageFolder(str(folder), transform=transform)
    except FileNotFoundError as error:  # no class folders, or no images in them
        raise SpecError(f"data.root: {folder}: {error} (expected {folder}/<class>/<image>)") from None


def build(spec: Spec, split: str) -> Dataset[Sample]:
    return _cifar(spec, split) if spec.data.dataset == "cifar10" else _imagefolder(spec, split)
