"""A custom data set whose samples take a while to load (sleeping, not computing): profiling a job on
it lasts long enough to cancel it, or to kill its worker, while the profiler runs. A test that needs two jobs
to be mid-way at once holds them: while the file named by $SLOW_DATA_HOLD exists, every sample takes HOLD_S."""

from __future__ import annotations

import os
import time

import torch
from torch.utils.data import Dataset

FACTORY = "tests.service.slow_data:make_dataset"
HOLD = "SLOW_DATA_HOLD"
HOLD_S = 0.1  # per sample while held: a 10-sample batch takes a second


class SlowDataset(Dataset[tuple[torch.Tensor, int]]):
    def __init__(self, count: int, delay_s: float, image_size: int) -> None:
        self.count, self.delay_s, self.image_size = count, delay_s, image_size

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if not 0 <= index < self.count:
            raise IndexError(index)
        hold = os.environ.get(HOLD)
        time.sleep(HOLD_S if hold and os.path.exists(hold) else self.delay_s)
        return torch.full((3, self.image_size, self.image_size), float(index % 7)), index % 10


def make_dataset(count: int = 40, delay_s: float = 1.0, image_size: int = 8) -> SlowDataset:
    return SlowDataset(count, delay_s, image_size)
