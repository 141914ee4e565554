"""Calibrating a layer profile from one end-to-end training run: what each rank's forward and backward
measured against what the profile predicted for them.

A run's plan (finetune_plan.json) holds its replayed step: per rank, the spans of every forward (F) and
backward (B, or I and W split) the profile predicted. Its telemetry gives, per rank, the median seconds
a step of each part. A rank's forward factor is its measured F over its predicted F; its backward
factor, its measured B + I + W over its predicted B + I + W. Every layer the rank computed takes the
rank's factors (a layer several ranks computed, as in ddp, their mean); a layer no rank computed keeps
its times. The factors scale the layer's times at both batches the profile measured (a micro-batch and
a ddp shard), so a calibration from one strategy's run predicts any other strategy's. Optimiser steps,
sends and the all-reduce keep their measured times.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

from pipebd_core.documents.finetune_plan import TrainSegment
from pipebd_core.documents.layer_profile import LayerProfile, LayerProfileEntry, LayerTimes
from pipebd_core.documents.profile import Timing
from pipebd_core.finetune.plan import TrainPlan

BACKWARD = ("B", "I", "W")
BACKWARD_TIMINGS = ("B", "I", "W", "I_kernel", "I_halves")


def predicted_parts(segments: Sequence[TrainSegment], nproc: int) -> list[dict[str, float]]:
    """Per rank, the replayed seconds of its forwards ("F") and backwards ("back")."""
    parts = [{"F": 0.0, "back": 0.0} for _ in range(nproc)]
    for segment in segments:
        kind = "F" if segment.kind == "F" else "back" if segment.kind in BACKWARD else None
        if kind is not None:
            parts[segment.rank][kind] += segment.end - segment.start
    return parts


def rank_layers(plan: TrainPlan) -> list[range]:
    """The layers each rank computes: its stage in a pipeline, every layer in ddp."""
    if plan.pipelined:
        return [range(start, stop) for start, stop in plan.stages]
    start, stop = plan.stages[0]
    return [range(start, stop)] * plan.nproc


def layer_factors(plan: TrainPlan, measured: Sequence[Mapping[str, float]]) -> dict[int, tuple[float, float]]:
    """Per layer some rank computed, its (forward, backward) factor: measured over predicted."""
    predictions = plan.details.predictions if plan.details is not None else None
    if predictions is None:
        raise ValueError("layer calibration: the run's plan has no replayed step; it was planned without a profile")
    if len(measured) != plan.nproc:
        raise ValueError(f"layer calibration: {len(measured)} ranks measured, the plan has {plan.nproc}")
    predicted = predicted_parts(predictions.simulation, plan.nproc)
    found: dict[int, list[tuple[float, float]]] = {}
    for rank, layers in enumerate(rank_layers(plan)):
        back = sum(measured[rank].get(part, 0.0) for part in BACKWARD)
        forward_factor = _ratio(measured[rank].get("F", 0.0), predicted[rank]["F"])
        backward_factor = _ratio(back, predicted[rank]["back"])
        for layer in layers:
            found.setdefault(layer, []).append((forward_factor, backward_factor))
    return {
        layer: (statistics.fmean(f for f, _ in pairs), statistics.fmean(b for _, b in pairs))
        for layer, pairs in found.items()
    }


def calibrated_layer_profile(
    profile: LayerProfile, plan: TrainPlan, measured: Sequence[Mapping[str, float]]
) -> LayerProfile:
    """`profile` with every layer's times scaled by the factors `plan`'s run measured (`measured`: per rank,
    seconds a step of each part, F, B, I, W)."""
    factors = layer_factors(plan, measured)
    layers = []
    for index, entry in enumerate(profile.layers):
        forward, backward = factors.get(index, (1.0, 1.0))
        layers.append(_scaled_entry(entry, forward, backward))
    return profile.model_copy(update={"layers": layers})


def _scaled_entry(entry: LayerProfileEntry, forward: float, backward: float) -> LayerProfileEntry:
    return entry.model_copy(
        update={
            "microbatch": _scaled_times(entry.microbatch, forward, backward),
            "shard": _scaled_times(entry.shard, forward, backward),
        }
    )


def _scaled_times(times: LayerTimes, forward: float, backward: float) -> LayerTimes:
    update: dict[str, Timing] = {"F": _scaled(times.F, forward)}
    for part in BACKWARD_TIMINGS:
        timing = getattr(times, part)
        if timing is not None:
            update[part] = _scaled(timing, backward)
    return times.model_copy(update=update)


def _scaled(timing: Timing, factor: float) -> Timing:
    return timing.model_copy(update={"median": timing.median * factor})


def _ratio(measured: float, predicted: float) -> float:
    """measured / predicted, 1 where nothing was predicted or measured (a part the rank did not run)."""
    return measured / predicted if predicted > 0 and measured > 0 else 1.0
