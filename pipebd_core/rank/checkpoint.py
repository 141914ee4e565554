"""Per-block checkpoints: any mode, any number of ranks, can resume from them.

Each block's owner writes `checkpoints/block-<i>/step-<s>.pt` (atomically) after the steps that
close an epoch or a `checkpoint_every` interval, and after the last step. Resuming loads, for each
block, the newest step, except that pipelined modes need every block at the same step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from pipebd_core.rundir import CheckpointFolder

KEEP_PER_BLOCK = 3


def should_checkpoint(step_done: int, steps_per_epoch: int, total_steps: int, every: int | None) -> bool:
    """Whether to save after `step_done` steps (a count, not an index)."""
    if step_done == total_steps:
        return True
    if every is not None and step_done % every == 0:
        return True
    return step_done % steps_per_epoch == 0  # at least one per epoch, whatever the interval


def save_block(
    folder: CheckpointFolder, block: int, step_done: int, state: dict[str, Any], num_blocks: int | None = None
) -> Path:
    """Write one block's checkpoint atomically, then prune that block's old ones.

    With `num_blocks`, pruning keeps every step the slowest block may still need: a pipelined
    resume needs one step saved by all blocks, and an upstream stage can run steps ahead.
    """
    path = folder.file(block, step_done)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    torch.save({"step": step_done, **state}, temporary)
    temporary.replace(path)
    slowest = _slowest_newest_step(folder, num_blocks) if num_blocks is not None else None
    for old in folder.files(block)[:-KEEP_PER_BLOCK]:
        if slowest is None or folder.step_of(old) < slowest:
            old.unlink(missing_ok=True)
    return path


def _slowest_newest_step(folder: CheckpointFolder, num_blocks: int) -> int:
    """The newest step of the block that has saved the least far (0 while any block has saved nothing)."""
    return min((folder.saved_steps(block)[-1:] or [0])[0] for block in range(num_blocks))


def load_block(folder: CheckpointFolder, block: int, step_done: int) -> dict[str, Any]:
    return torch.load(folder.file(block, step_done), map_location="cpu", weights_only=True)
