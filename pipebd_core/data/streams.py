"""Sample streams and row ranges: how a spec's data turns into optimiser steps (`StepPlan`, `Stream`,
`SearchSchedule`) and how a batch splits over replicas (`shard_rows`, `even_ranges`). Both phases' plans,
the batch loaders and the telemetry downsampling use them."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from pipebd_core.documents.errors import PlanError
from pipebd_core.documents.parts import StepCounts


@dataclass(frozen=True)
class Stream:
    """A range of sample indices with its own seeded batch order: training batches, or held-out ones."""

    name: str  # "train", or "arch" for the batches of architecture updates (nas)
    first: int  # first sample index of the range
    count: int  # samples in the range


@dataclass(frozen=True)
class SearchSchedule:
    """When architecture updates run (nas): after each `every`-th weight step from step `from_step`."""

    from_step: int
    every: int


@dataclass(frozen=True)
class StepPlan:
    """How a spec's data turns into optimiser steps: counts, the sample streams, the architecture updates."""

    total: int  # optimiser steps per block in the whole run
    per_epoch: int
    train: Stream
    arch: Stream | None = None  # nas: the held-out batches of architecture updates
    search: SearchSchedule | None = None

    def stream(self, round_: str) -> Stream | None:
        return self.train if round_ == "weights" else self.arch

    def to_json(self) -> dict[str, Any]:
        return {
            "total_steps": self.total,
            "steps_per_epoch": self.per_epoch,
            "num_samples": self.train.count,
            "streams": {"weights": asdict(self.train), "arch": asdict(self.arch) if self.arch else None},
            "search": asdict(self.search) if self.search else None,
        }

    def counts(self) -> StepCounts:
        """The step counts as the plan documents write them."""
        return StepCounts.model_validate(self.to_json())

    @classmethod
    def from_counts(cls, counts: StepCounts) -> StepPlan:
        arch, search = counts.streams.arch, counts.search
        return cls(
            total=counts.total_steps,
            per_epoch=counts.steps_per_epoch,
            train=Stream(**counts.streams.weights.model_dump()),
            arch=Stream(**arch.model_dump()) if arch else None,
            search=SearchSchedule(**search.model_dump()) if search else None,
        )


def shard_rows(batch_size: int, replicas: int) -> list[tuple[int, int]]:
    """Split `batch_size` rows into `replicas` contiguous shards differing by at most one row."""
    if replicas > batch_size:
        raise PlanError(
            f"a batch of {batch_size} rows cannot be split over {replicas} replicas (a shard would be empty);"
            f" use at most {batch_size} replicas or a batch of at least {replicas}"
        )
    return even_ranges(batch_size, replicas)


def even_ranges(length: int, parts: int) -> list[tuple[int, int]]:
    """`parts` consecutive [start, stop) ranges covering `length` items, sizes differing by at most one
    (the larger ones first)."""
    base, extra = divmod(length, parts)
    bounds, start = [], 0
    for index in range(parts):
        stop = start + base + (1 if index < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds
