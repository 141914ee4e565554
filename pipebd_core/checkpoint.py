"""Per-block checkpoints: any mode, any number of ranks, can resume from them.

Each block's owner writes `checkpoints/block-<i>/step-<s>.pt` (atomically) after the steps that
close an epoch or a `checkpoint_every` interval, and after the last step. Resuming loads, for each
block, the newest step, except that pipelined modes need every block at the same step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

KEEP_PER_BLOCK = 3


def should_checkpoint(step_done: int, steps_per_epoch: int, total_steps: int, every: int | None) -> bool:
    """Whether to save after `step_done` steps (a count, not an index)."""
    if step_done == total_steps:
        return True
    if every is not None:
        return step_done % every == 0
    return step_done % steps_per_epoch == 0


def save_block(folder: Path, block: int, step_done: int, state: dict[str, Any]) -> Path:
    directory = folder / f"block-{block}"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"step-{step_done:09d}.pt"
    temporary = path.with_suffix(".tmp")
    torch.save({"step": step_done, **state}, temporary)
    temporary.replace(path)
    for old in sorted(directory.glob("step-*.pt"))[:-KEEP_PER_BLOCK]:
        old.unlink(missing_ok=True)
    return path


def saved_steps(folder: Path, block: int) -> list[int]:
    directory = folder / f"block-{block}"
    return sorted(int(path.stem.split("-")[1]) for path in directory.glob("step-*.pt"))


def load_block(folder: Path, block: int, step_done: int) -> dict[str, Any]:
    path = folder / f"block-{block}" / f"step-{step_done:09d}.pt"
    return torch.load(path, map_location="cpu", weights_only=True)


def resume_steps(folder: Path, num_blocks: int, common: bool) -> list[int]:
    """The step each block resumes from (0 = from scratch); `common` forces one step for all blocks."""
    per_block = [saved_steps(folder, block) for block in range(num_blocks)]
    if not common:
        return [steps[-1] if steps else 0 for steps in per_block]
    shared = set(per_block[0]).intersection(*per_block[1:]) if per_block else set()
    step = max(shared, default=0)
    return [step] * num_blocks
