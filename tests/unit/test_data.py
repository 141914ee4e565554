"""tier: pure logic, CPU

Data sets (synthetic, CIFAR-10 and ImageFolder trees written here, custom factories) and the
deterministic global batch order that every execution mode shares.
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from pipebd_core.data.batches import (
    BatchLoader,
    global_batch_indices,
    iterate_eval_batches,
    steps_per_epoch,
    total_steps,
)
from pipebd_core.data.datasets import build_dataset, check_dataset
from pipebd_core.data.digits import read_digits
from pipebd_core.spec import Spec, SpecError, parse_spec


def make_spec(seed: int = 0, train: dict[str, Any] | None = None, **data: Any) -> Spec:
    return parse_spec({"data": data, "train": {"seed": seed, **(train or {})}})


def make_dataset(count: int = 5, size: int = 8) -> list[torch.Tensor]:
    """A custom data set factory whose items are bare tensors (no labels)."""
    return [torch.full((3, size, size), float(i)) for i in range(count)]


# --- synthetic -------------------------------------------------------------------------------------------


def test_synthetic_is_deterministic_across_builds() -> None:
    first, second = build_dataset(make_spec(num_samples=8)), build_dataset(make_spec(num_samples=8))
    for i in (0, 3, 7):
        assert torch.equal(first[i][0], second[i][0])
        assert first[i][1] == second[i][1]
    assert not torch.equal(first[0][0], first[1][0])


def test_synthetic_differs_between_seeds() -> None:
    a, b = build_dataset(make_spec(seed=0, num_samples=4)), build_dataset(make_spec(seed=1, num_samples=4))
    assert not torch.equal(a[0][0], b[0][0])


@pytest.mark.parametrize("size", [32, 224])
def test_synthetic_shapes_and_labels(size: int) -> None:
    dataset = build_dataset(make_spec(num_samples=3, image_size=size, num_classes=7))
    assert len(dataset) == 3  # type: ignore[arg-type]
    image, label = dataset[2]
    assert image.shape == (3, size, size) and image.dtype == torch.float32
    assert isinstance(label, int) and 0 <= label < 7
    with pytest.raises(IndexError):
        dataset[3]


def test_synthetic_sample_independent_of_num_samples() -> None:
    small, large = build_dataset(make_spec(num_samples=6)), build_dataset(make_spec(num_samples=5000))
    assert torch.equal(small[5][0], large[5][0]) and small[5][1] == large[5][1]


def test_synthetic_eval_split_is_a_different_set() -> None:
    spec = make_spec(num_samples=20, eval_samples=5)
    train, evaluation = build_dataset(spec), build_dataset(spec, "eval")
    assert len(evaluation) == 5  # type: ignore[arg-type]
    assert not torch.equal(train[0][0], evaluation[0][0])
    assert len(build_dataset(make_spec(num_samples=3, eval_samples=5), "eval")) == 3  # type: ignore[arg-type]


# --- batch order -----------------------------------------------------------------------------------------


def test_every_step_is_a_full_batch_and_an_epoch_is_disjoint() -> None:
    spec = make_spec(num_samples=50, batch_size=8)
    per_epoch = steps_per_epoch(spec, 50)
    assert per_epoch == 6
    for epoch in range(2):
        seen: set[int] = set()
        for step in range(epoch * per_epoch, (epoch + 1) * per_epoch):
            indices = global_batch_indices(spec, 50, step)
            assert len(indices) == 8 and all(0 <= i < 50 for i in indices)
            assert seen.isdisjoint(indices)
            seen.update(indices)
        assert len(seen) == 48


def test_shuffled_epochs_differ_and_are_reproducible() -> None:
    spec = make_spec(num_samples=40, batch_size=10)
    epoch0 = [global_batch_indices(spec, 40, s) for s in range(4)]
    epoch1 = [global_batch_indices(spec, 40, s) for s in range(4, 8)]
    assert epoch0 != epoch1
    assert epoch0 != [list(range(i * 10, i * 10 + 10)) for i in range(4)]
    assert global_batch_indices(make_spec(num_samples=40, batch_size=10), 40, 5) == epoch1[1]
    assert global_batch_indices(make_spec(seed=3, num_samples=40, batch_size=10), 40, 0) != epoch0[0]


def test_unshuffled_batches_are_consecutive_slices() -> None:
    spec = make_spec(num_samples=10, batch_size=3, shuffle=False)
    assert [global_batch_indices(spec, 10, s) for s in range(4)] == [
        [0, 1, 2],
        [3, 4, 5],
        [6, 7, 8],
        [0, 1, 2],
    ]
    with pytest.raises(ValueError, match="step"):
        global_batch_indices(spec, 10, -1)


def test_steps_per_epoch_drops_partial_batch_and_rejects_oversized_batch() -> None:
    assert steps_per_epoch(make_spec(batch_size=3), 10) == 3
    assert steps_per_epoch(make_spec(batch_size=5), 10) == 2
    with pytest.raises(SpecError, match=r"batch_size.*at most 10"):
        steps_per_epoch(make_spec(batch_size=11), 10)


def test_total_steps_counts_epochs_and_is_capped_by_max_steps() -> None:
    assert total_steps(make_spec(batch_size=4, train={"epochs": 3}), 10) == 6
    assert total_steps(make_spec(batch_size=4, train={"epochs": 3, "max_steps": 4}), 10) == 4
    assert total_steps(make_spec(batch_size=4, train={"epochs": 1, "max_steps": 50}), 10) == 2


def test_row_slices_concatenate_to_the_full_batch(workers: int = 0) -> None:
    """In this process; tests/ranks/test_loader_workers.py runs the same with two loader worker processes."""
    spec = make_spec(num_samples=20, batch_size=6, image_size=8, num_workers=workers)
    dataset = build_dataset(spec)
    steps = range(1, 8)  # crosses two epoch boundaries (3 steps per epoch)
    full = list(BatchLoader(spec, dataset, (0, 6), steps, "cpu"))
    head = list(BatchLoader(spec, dataset, (0, 2), steps, "cpu"))
    tail = list(BatchLoader(spec, dataset, (2, 6), steps, "cpu"))
    assert [step for step, _ in full] == list(steps) == [step for step, _ in tail]
    for (step, whole), (_, a), (_, b) in zip(full, head, tail, strict=True):
        assert a.shape == (2, 3, 8, 8) and b.shape == (4, 3, 8, 8)
        assert torch.equal(torch.cat([a, b]), whole)
        expected = torch.stack([dataset[i][0] for i in global_batch_indices(spec, 20, step)])
        assert torch.equal(whole, expected)


def test_batch_loader_rejects_bad_rows() -> None:
    spec = make_spec(num_samples=20, batch_size=6)
    for rows in [(0, 7), (3, 3), (-1, 2)]:
        with pytest.raises(ValueError, match="rows"):
            BatchLoader(spec, build_dataset(spec), rows, range(2), "cpu")


def test_eval_batches_are_in_order_and_capped() -> None:
    spec = make_spec(num_samples=20, eval_samples=7, image_size=8)
    dataset = build_dataset(spec, "eval")
    batches = list(iterate_eval_batches(spec, dataset, 3))
    assert [inputs.shape[0] for inputs, _ in batches] == [3, 3, 1]
    labels = torch.cat([labels for _, labels in batches])
    assert labels.tolist() == [dataset[i][1] for i in range(7)]
    assert torch.equal(batches[1][0][0], dataset[3][0])


# --- cifar10 ---------------------------------------------------------------------------------------------


def write_cifar(root: Path, per_batch: int = 2, test_rows: int = 3, skip: str | None = None) -> Path:
    """CIFAR-10's python on-disk format: pickled dicts with "data" (N, 3072) uint8 and "labels"."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for number, name in enumerate(names):
        rows = test_rows if name == "test_batch" else per_batch
        data = np.full((rows, 3072), 10 * number, dtype=np.uint8)
        data[0, 0] = 255  # red channel, pixel (0, 0) of each file's first image
        labels = [(number + r) % 10 for r in range(rows)]
        if name != skip:
            (folder / name).write_bytes(pickle.dumps({"data": data, "labels": labels}))
    meta = {"label_names": [f"class{i}" for i in range(10)]}
    (folder / "batches.meta").write_bytes(pickle.dumps(meta))
    return folder


def test_cifar10_loads_a_locally_written_tree(tmp_path: Path) -> None:
    write_cifar(tmp_path)
    spec = make_spec(dataset="cifar10", root=str(tmp_path), batch_size=2)
    train, evaluation = build_dataset(spec), build_dataset(spec, "eval")
    assert len(train) == 10 and len(evaluation) == 3  # type: ignore[arg-type]
    assert check_dataset(spec) == 10
    image, label = train[2]  # first image of data_batch_2
    assert image.shape == (3, 32, 32) and label == 1
    assert image[0, 0, 0].item() == pytest.approx((1.0 - 0.4914) / 0.2470, abs=1e-4)
    assert image[1, 5, 5].item() == pytest.approx((10 / 255 - 0.4822) / 0.2435, abs=1e-4)
    assert evaluation[1][1] == 6


def test_cifar10_resizes_and_accepts_the_batches_folder_as_root(tmp_path: Path) -> None:
    folder = write_cifar(tmp_path)
    image, _ = build_dataset(make_spec(dataset="cifar10", root=str(folder), image_size=16))[0]
    assert image.shape == (3, 16, 16)


def test_cifar10_missing_tree_names_the_path(tmp_path: Path) -> None:
    spec = make_spec(dataset="cifar10", root=str(tmp_path / "nowhere"))
    with pytest.raises(SpecError, match=r"no such folder.*Nothing is downloaded") as error:
        check_dataset(spec)
    assert str(tmp_path / "nowhere" / "cifar-10-batches-py") in str(error.value)
    assert "data_batch_1" in str(error.value) and "batches.meta" in str(error.value)


def test_cifar10_missing_file_is_named(tmp_path: Path) -> None:
    write_cifar(tmp_path, skip="test_batch")
    with pytest.raises(SpecError, match=r"missing test_batch\)"):
        build_dataset(make_spec(dataset="cifar10", root=str(tmp_path)))


# --- imagefolder -----------------------------------------------------------------------------------------


def write_images(root: Path, per_class: int = 3) -> None:
    for label, color in enumerate([(255, 0, 0), (0, 0, 255)]):
        folder = root / f"class{label}"
        folder.mkdir(parents=True)
        for i in range(per_class):
            Image.new("RGB", (12, 10), color).save(folder / f"{i}.png")


def test_imagefolder_loads_a_tree(tmp_path: Path) -> None:
    write_images(tmp_path)
    spec = make_spec(dataset="imagefolder", root=str(tmp_path), image_size=8, batch_size=2)
    dataset = build_dataset(spec)
    assert check_dataset(spec) == 6
    image, label = dataset[4]
    assert image.shape == (3, 8, 8) and label == 1
    assert image[2, 4, 4].item() == pytest.approx((1.0 - 0.406) / 0.225, abs=1e-4)  # blue
    assert len(build_dataset(spec, "eval")) == 6  # type: ignore[arg-type]


def test_imagefolder_uses_train_and_val_subfolders(tmp_path: Path) -> None:
    write_images(tmp_path / "train", per_class=3)
    write_images(tmp_path / "val", per_class=1)
    spec = make_spec(dataset="imagefolder", root=str(tmp_path), image_size=8)
    assert len(build_dataset(spec)) == 6 and len(build_dataset(spec, "eval")) == 2  # type: ignore[arg-type]


def test_imagefolder_missing_or_empty_root_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "absent"
    with pytest.raises(SpecError, match="does not exist") as error:
        check_dataset(make_spec(dataset="imagefolder", root=str(missing)))
    assert str(missing) in str(error.value)
    with pytest.raises(SpecError) as error:
        check_dataset(make_spec(dataset="imagefolder", root=str(tmp_path)))
    assert str(tmp_path) in str(error.value)
    (tmp_path / "class0").mkdir()
    (tmp_path / "class0" / "notes.txt").write_text("not an image")
    with pytest.raises(SpecError, match="no valid file"):
        check_dataset(make_spec(dataset="imagefolder", root=str(tmp_path)))


# --- custom ----------------------------------------------------------------------------------------------


def test_custom_factory_bare_tensors_are_wrapped() -> None:
    spec = make_spec(dataset="custom", factory="tests.unit.test_data:make_dataset", options={"count": 6}, batch_size=2)
    dataset = build_dataset(spec)
    assert check_dataset(spec) == 6
    image, label = dataset[4]
    assert label == -1 and torch.equal(image, torch.full((3, 8, 8), 4.0))
    (step, inputs), *_ = list(BatchLoader(spec, dataset, (0, 2), [0], "cpu"))
    assert step == 0 and inputs.shape == (2, 3, 8, 8)


def test_custom_factory_that_cannot_be_imported_is_a_spec_error() -> None:
    with pytest.raises(SpecError, match=r"data\.factory"):
        build_dataset(make_spec(dataset="custom", factory="tests.no_such_module:make"))


def test_digits_are_the_real_images_with_a_fixed_disjoint_split() -> None:
    spec = make_spec(dataset="digits", image_size=16)
    train, held = build_dataset(spec, "train"), build_dataset(spec, "eval")
    assert len(train) + len(held) == 1797 and len(held) == 359  # 80% / 20% of scikit-learn's digits
    image, _ = train[0]
    assert image.shape == (3, 16, 16) and torch.equal(image[0], image[2])  # grey, repeated to 3 channels
    labels = {int(train[i][1]) for i in range(len(train))}
    assert labels == set(range(10))
    ours, again = (
        set(train.indices.tolist()),
        set(build_dataset(make_spec(dataset="digits", seed=9), "train").indices.tolist()),
    )
    assert ours == again  # the split does not follow train.seed
    assert not ours & set(held.indices.tolist())
    with pytest.raises(SpecError, match=re.escape("data.num_classes: the digits have 10 classes")):
        build_dataset(make_spec(dataset="digits", num_classes=5))


def test_digits_are_read_as_scikit_learn_loads_them_without_importing_it() -> None:
    """The ranks read scikit-learn's own file (importing scikit-learn costs each process a second): the
    same pixels, labels and order as `load_digits`."""
    from sklearn.datasets import load_digits

    pixels, labels = read_digits()
    digits = load_digits()
    assert torch.equal(pixels.reshape(-1, 8, 8), torch.tensor(digits.images, dtype=torch.float32))
    assert torch.equal(labels, torch.tensor(digits.target, dtype=torch.long))
