"""Profiles written by hand, so the cost model, planner and simulator can be checked exactly."""

from __future__ import annotations

import math
from typing import Any


def fake_profile(
    teacher: list[float],
    student: list[float],
    nproc: int,
    batch_size: int = 12,
    memory_limit: int = 10**12,
    p2p: float = 0.0,
    data: float = 0.0,
    allreduce: float = 0.0,
    student_bytes: int = 1000,
) -> dict[str, Any]:
    """Times at full batch scale linearly with the per-replica batch; memory grows with block size."""
    sizes = sorted({math.ceil(batch_size / k) for k in range(1, nproc + 1)}, reverse=True)

    def timing(full: float, batch: int) -> dict[str, float]:
        return {"median": full * batch / batch_size, "spread": 0.0, "trials": 1}

    blocks = [
        {
            "teacher_s": {str(b): timing(t, b) for b in sizes},
            "student_s": {str(b): timing(s, b) for b in sizes},
            "saved_bytes": {str(b): student_bytes * b for b in sizes},
            "teacher_param_bytes": 4000 * (i + 1),
            "student_param_bytes": 400 * (i + 1),
            "allreduce_s": {str(k): {"median": allreduce, "spread": 0.0, "trials": 1} for k in range(2, nproc + 1)},
        }
        for i, (t, s) in enumerate(zip(teacher, student, strict=True))
    ]
    return {
        "nproc": nproc,
        "batch_size": batch_size,
        "batch_sizes": sizes,
        "device": "fake",
        "device_memory_bytes": memory_limit,
        "baseline_bytes": 0,
        "shapes": [[4, 2, 2]] * (len(teacher) + 1),
        "blocks": blocks,
        "data_s": {str(b): timing(data, b) for b in sizes},
        "p2p_s": [{str(b): timing(p2p, b) for b in sizes} for _ in range(len(teacher) + 1)],
    }


def fake_layer_profile(
    layers: int,
    f: float,
    i: float,
    w: float,
    b: float,
    kept_bytes: int = 1000,
    memory_limit: int = 10**12,
    p2p_per_byte: float = 0.0,
) -> Any:
    """A finetune cost model whose every layer takes the given seconds per micro-batch and carries 4-byte
    outputs and inputs and a 400-byte weight; sends take `p2p_per_byte` seconds a byte (none at 0)."""
    from pipebd_core.planning.simulate_training import TrainCosts

    def timing(value: float) -> dict[str, float]:
        return {"median": value, "spread": 0.0, "trials": 1}

    entry = {key: timing(value) for key, value in {"F": f, "I": i, "W": w, "B": b, "optim": 0.0}.items()}
    layer = {"microbatch": {**entry, "saved_bytes": kept_bytes}, "shard": {**entry, "saved_bytes": kept_bytes}}
    sizes = (1, 100, 10_000)  # float32 elements
    return TrainCosts(
        {
            "batches": {"microbatch": 1, "shard": 1},
            "device_memory_bytes": memory_limit,
            "layers": [
                {
                    **layer,
                    "output_bytes_per_sample": 4,
                    "input_bytes_per_sample": 4,
                    "param_bytes": 400,
                    "weight_bytes": 400,
                }
                for _ in range(layers)
            ],
            "p2p_s": {str(size): timing(4 * size * p2p_per_byte) for size in sizes} if p2p_per_byte else {},
            "allreduce_s": timing(0.0),
        }
    )
