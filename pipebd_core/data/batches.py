"""The deterministic global batch order shared by every execution mode, and the loaders that follow it.

Every mode sees the same sequence of global batches: global step `s` always covers the same
`batch_size` sample indices (from `train.seed`, `data.shuffle` and the epoch), so all modes
train identical students. A rank loads only its rows `[start, stop)` of each global batch.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Sequence

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from pipebd_core.data.datasets import Sample, mix_seed
from pipebd_core.data.streams import Stream
from pipebd_core.spec import Spec, SpecError


def steps_per_epoch(spec: Spec, num_samples: int) -> int:
    """Full global batches per epoch; the last partial batch is dropped."""
    steps = num_samples // spec.data.batch_size
    if steps == 0:
        raise SpecError(
            f"data.batch_size: {spec.data.batch_size} exceeds the data set size ({num_samples} samples); "
            f"use a batch_size of at most {num_samples}"
        )
    return steps


def total_steps(spec: Spec, num_samples: int) -> int:
    """Optimiser steps per block: epochs x steps_per_epoch, capped by train.max_steps."""
    steps = spec.train.epochs * steps_per_epoch(spec, num_samples)
    return min(steps, spec.train.max_steps) if spec.train.max_steps else steps


def split_streams(spec: Spec, num_samples: int, holdout: float | None) -> tuple[Stream, Stream | None]:
    """The training stream and, when `holdout` is set, the held-out stream of architecture batches."""
    if holdout is None:
        return Stream("train", 0, num_samples), None
    held = max(spec.data.batch_size, round(holdout * num_samples))
    if num_samples - held < spec.data.batch_size:
        raise SpecError(
            f"workload.arch_holdout: holding out {held} of {num_samples} samples leaves fewer than one batch"
            f" ({spec.data.batch_size}) to train on; use more samples or a smaller batch_size"
        )
    return Stream("train", 0, num_samples - held), Stream("arch", num_samples - held, held)


@functools.lru_cache(maxsize=8)
def _epoch_order(seed: int, name: str, num_samples: int, epoch: int, shuffle: bool) -> torch.Tensor:
    if not shuffle:
        return torch.arange(num_samples)
    label = "epoch" if name == "train" else name
    return torch.randperm(num_samples, generator=torch.Generator().manual_seed(mix_seed(seed, label, epoch)))


def stream_batch_indices(spec: Spec, stream: Stream, index: int) -> list[int]:
    """The sample indices of batch `index` (0-based, counting across epochs) of `stream`."""
    if index < 0:
        raise ValueError(f"step must be >= 0, got {index}")
    per_epoch, size = steps_per_epoch(spec, stream.count), spec.data.batch_size
    epoch, offset = divmod(index, per_epoch)
    order = _epoch_order(spec.train.seed, stream.name, stream.count, epoch, spec.data.shuffle)
    return (order[offset * size : (offset + 1) * size] + stream.first).tolist()


def global_batch_indices(spec: Spec, num_samples: int, step: int) -> list[int]:
    """The sample indices of global step `step` of the training stream over `num_samples` samples."""
    return stream_batch_indices(spec, Stream("train", 0, num_samples), step)


def _stack_inputs(items: Sequence[Sample]) -> torch.Tensor:
    return torch.stack([item[0] for item in items])


def _stack_pairs(items: Sequence[Sample]) -> tuple[torch.Tensor, torch.Tensor]:
    return _stack_inputs(items), torch.stack([torch.as_tensor(item[1]) for item in items])


class _StepSampler(Sampler[list[int]]):
    """Yields, per requested step, this rank's rows of the stream's global batch as dataset indices."""

    def __init__(self, spec: Spec, stream: Stream, rows: tuple[int, int], steps: list[int]) -> None:
        self.spec, self.stream, self.rows, self.steps = spec, stream, rows, steps

    def __len__(self) -> int:
        return len(self.steps)

    def __iter__(self) -> Iterator[list[int]]:
        start, stop = self.rows
        for step in self.steps:
            yield stream_batch_indices(self.spec, self.stream, step)[start:stop]


class BatchLoader:
    """Iterates `(step, inputs)` over `steps`: rows `[rows[0], rows[1])` of each global batch, on `device`.

    `steps` index the batches of `stream` (default: the training stream over the whole data set)."""

    def __init__(
        self,
        spec: Spec,
        dataset: Dataset[Sample],
        rows: tuple[int, int],
        steps: Iterable[int],
        device: torch.device | str,
        stream: Stream | None = None,
    ) -> None:
        if not 0 <= rows[0] < rows[1] <= spec.data.batch_size:
            raise ValueError(f"rows {rows}: need 0 <= start < stop <= batch_size ({spec.data.batch_size})")
        self.spec, self.dataset, self.device = spec, dataset, torch.device(device)
        self.steps = list(steps)
        stream = stream or Stream("train", 0, len(dataset))  # type: ignore[arg-type]
        self.sampler = _StepSampler(spec, stream, rows, self.steps)

    def __len__(self) -> int:
        return len(self.steps)

    def __iter__(self) -> Iterator[tuple[int, torch.Tensor]]:
        workers = self.spec.data.num_workers
        if workers == 0:
            batches: Iterable[torch.Tensor] = (
                _stack_inputs([self.dataset[i] for i in indices]) for indices in self.sampler
            )
        else:
            batches = DataLoader(
                self.dataset,
                batch_sampler=self.sampler,
                num_workers=workers,
                collate_fn=_stack_inputs,
                persistent_workers=False,
                pin_memory=self.device.type == "cuda",
            )
        non_blocking = self.device.type == "cuda" and workers > 0
        for step, inputs in zip(self.steps, batches, strict=True):
            yield step, inputs.to(self.device, non_blocking=non_blocking)


def labelled_batches(
    spec: Spec,
    dataset: Dataset[Sample],
    rows: tuple[int, int],
    steps: Iterable[int],
    device: torch.device,
    stream: Stream,
) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
    """`(step, inputs, labels)` of rows `[rows[0], rows[1])` of each global batch of `stream` (end-to-end
    training: the same batch order as distillation's, with the labels)."""
    steps = list(steps)
    for step, indices in zip(steps, _StepSampler(spec, stream, rows, steps), strict=True):
        inputs, labels = _stack_pairs([dataset[i] for i in indices])
        yield step, inputs.to(device), labels.to(device)


def iterate_eval_batches(
    spec: Spec, dataset: Dataset[Sample], batch_size: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """`(inputs, labels)` in index order over the first `data.eval_samples` samples; the last may be short."""
    count = min(len(dataset), spec.data.eval_samples)  # type: ignore[arg-type]
    subset = torch.utils.data.Subset(dataset, range(count))
    workers = spec.data.num_workers
    loader = DataLoader(subset, batch_size=batch_size, num_workers=workers, collate_fn=_stack_pairs)
    yield from loader
