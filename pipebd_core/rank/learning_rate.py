"""The learning-rate schedule every training rank follows (distill and finetune alike)."""

from __future__ import annotations

import math

from pipebd_core.spec import Spec


def learning_rate(spec: Spec, step: int, total_steps: int) -> float:
    if spec.train.lr_schedule == "constant":
        return spec.train.lr
    return spec.train.lr * 0.5 * (1.0 + math.cos(math.pi * step / total_steps))
