"""Profiles written by hand (as typed documents), so the cost model, planner and simulator can be checked
exactly."""

from __future__ import annotations

import math

from pipebd_core.documents.layer_profile import LayerBatches, LayerProfile, LayerProfileEntry, LayerTimes
from pipebd_core.documents.profile import BlockProfile, Profile, Timing
from pipebd_core.planning.finetune_simulate import TrainCosts


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
    replicated: float | None = None,
) -> Profile:
    """Times at full batch scale linearly with the per-replica batch; memory grows with block size. `replicated`:
    a student step on k > 1 replicas (its BatchNorm synchronised) costs that many times its plain step at
    ceil(B/k) rows (None: no such measurement, as in a profile written by hand)."""
    sizes = sorted({math.ceil(batch_size / k) for k in range(1, nproc + 1)}, reverse=True)

    def timing(full: float, batch: int) -> Timing:
        return Timing(median=full * batch / batch_size, trials=1)

    blocks = [
        BlockProfile(
            teacher_s={b: timing(t, b) for b in sizes},
            student_s={b: timing(s, b) for b in sizes},
            saved_bytes={b: student_bytes * b for b in sizes},
            teacher_param_bytes=4000 * (i + 1),
            student_param_bytes=400 * (i + 1),
            allreduce_s={k: Timing(median=allreduce, trials=1) for k in range(2, nproc + 1)},
            student_group_s={}
            if replicated is None
            else {k: timing(replicated * s, math.ceil(batch_size / k)) for k in range(2, nproc + 1)},
        )
        for i, (t, s) in enumerate(zip(teacher, student, strict=True))
    ]
    shape = [4, 2, 2]
    return Profile(
        nproc=nproc,
        batch_size=batch_size,
        batch_sizes=sizes,
        device="fake",
        device_memory_bytes=memory_limit,
        baseline_bytes=0,
        shapes=[shape] * (len(teacher) + 1),
        boundary_bytes_per_sample=[4 * math.prod(shape)] * (len(teacher) + 1),  # float32
        blocks=blocks,
        data_s={b: timing(data, b) for b in sizes},
        p2p_s=[{b: timing(p2p, b) for b in sizes} for _ in range(len(teacher) + 1)],
    )


def fake_layer_profile(
    layers: int,
    f: float,
    i: float,
    w: float,
    b: float,
    kept_bytes: int = 1000,
    memory_limit: int = 10**12,
    p2p_per_byte: float = 0.0,
) -> TrainCosts:
    """A finetune cost model whose every layer takes the given seconds per micro-batch and carries 4-byte
    outputs and inputs and a 400-byte weight; sends take `p2p_per_byte` seconds a byte (none at 0)."""

    def timing(value: float) -> Timing:
        return Timing(median=value, trials=1)

    times = LayerTimes(F=timing(f), B=timing(b), I=timing(i), W=timing(w), optim=timing(0.0), saved_bytes=kept_bytes)
    entry = LayerProfileEntry(
        microbatch=times,
        shard=times,
        output_bytes_per_sample=4,
        input_bytes_per_sample=4,
        param_bytes=400,
        weight_bytes=400,
    )
    sizes = (1, 100, 10_000)  # float32 elements
    return TrainCosts(
        LayerProfile(
            nproc=1,
            batches=LayerBatches(microbatch=1, shard=1),
            device="fake",
            device_memory_bytes=memory_limit,
            shapes=[[1]] * (layers + 1),
            layers=[entry] * layers,
            p2p_s={size: timing(4 * size * p2p_per_byte) for size in sizes} if p2p_per_byte else {},
            allreduce_s=timing(0.0),
        )
    )
