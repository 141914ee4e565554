"""Telemetry lines for tests that need some without running ranks: every field a rank writes, with
plain defaults that a test overrides where its check depends on them."""

from __future__ import annotations

from typing import Any

from pipebd_core.documents.telemetry import BlockSeconds, DistillLine, FinetuneLine


def distill_line(rank: int = 0, step: int = 0, **fields: Any) -> DistillLine:
    """A distillation task's line; `done` is step + 1 unless given, `blocks` the keys of `loss`."""
    loss = fields.pop("loss", {0: 1.0})
    values: dict[str, Any] = {
        "time": float(step),
        "epoch": 0,
        "blocks": [int(block) for block in loss],
        "phases": {"teacher": 0.01},
        "block_s": BlockSeconds(teacher={}, student={}),
        "samples": 8,
        "peak_mem": 0,
        "cur_mem": 0,
        "done": step + 1,
        "total": step + 1,
        **fields,
    }
    return DistillLine(rank=rank, step=step, loss=loss, **values)


def finetune_line(rank: int = 0, step: int = 0, **fields: Any) -> FinetuneLine:
    """An end-to-end training step's line; `done` is step + 1 unless given."""
    values: dict[str, Any] = {
        "time": float(step),
        "epoch": 0,
        "times": {"F": 0.01},
        "elapsed": 0.01,
        "peak_mem": 0,
        "cur_mem": 0,
        "done": step + 1,
        "total": step + 1,
        **fields,
    }
    return FinetuneLine(rank=rank, step=step, **values)
