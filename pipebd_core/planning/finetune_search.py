"""The stage cuts of a finetune plan: which partition a pipelined strategy runs, and what it moves.

The spec's `finetune.stages` (with `finetune.moved`, the share of each boundary layer's delta the next
stage computes), or the partitioner `finetune.partitioner` names (planning/finetune_partition.py) over the layer
costs: F, delta and G per micro-batch from the layer profile (I and W for zb's split backward, B's
input-gradient part and the rest otherwise), or FLOP estimates without one. A layer's delta is movable
(LayerPipe's classification) when it can be split along its input channels (finetune/moved.py) and moving
all of it would cost little communication and memory: its weight once a step and its input gradient
each micro-batch take at most MOVE_COMM_SHARE of the delta's time to send, and its weight, which the
next stage then receives and holds, is at most MOVE_WEIGHT_SHARE of the activations the boundary passes
in a step (the paper's premise: weights are kilobytes where activations are megabytes; a classifier's
100-million-weight Linear is the opposite). Shares become whole channels (planned ones whole blocks of
CHANNEL_BLOCK, where a layer has several: CPU convolution kernels work in blocks of 16 channels and a
slice of fewer costs about as much); `partition_details` is what finetune_plan.json says about the cut:
stages, each stage's F / delta / G, every move and its bytes.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from torch import nn

from pipebd_core.documents.errors import PlanError
from pipebd_core.documents.finetune_plan import Move, PartitionEntry, StageWork
from pipebd_core.planning.finetune_partition import PARTITIONER_FUNCTIONS, LayerCost, Partition, pipedream, stage_work
from pipebd_core.planning.finetune_simulate import TrainCosts
from pipebd_core.rank.channels import SPLITTABLE, split_channels
from pipebd_core.rank.network import Network
from pipebd_core.spec import Spec, SpecError

MOVE_COMM_SHARE = 0.5  # movable: sending the weight (per micro-batch, amortised) and the partial gradient
MOVE_WEIGHT_SHARE = 0.25  # takes at most this share of the delta's time, the weight this share of activations
CHANNEL_BLOCK = 16  # planned shares move whole blocks of channels: a kernel on fewer costs about as much
FLOAT_BYTES = 4


@dataclass(frozen=True)
class Layers:
    """What planning knows of the network to cut: its layers, the shape entering each (and the logits'),
    FLOPs per sample, and the layer profile when one was measured."""

    network: Network
    shapes: list[list[int]]
    flops: list[float]
    costs: TrainCosts | None

    def describe(self, index: int) -> str:
        return f"layer {index} ({self.network.names[index]}, {type(self.network.layers[index]).__name__})"


def stage_cuts(spec: Spec, flops: list[float]) -> list[tuple[int, int]]:
    """One stage of contiguous layers per rank: finetune.stages, or balanced on FLOP estimates."""
    tune, layers, nproc = spec.finetune, len(flops), spec.schedule.world_size  # every rank of every node
    assert tune is not None
    if nproc > layers:
        fewer = f"--nproc {layers}" if spec.schedule.nodes == 1 else f"{layers} ranks in all (nodes x nproc)"
        raise SpecError(
            f"schedule.nproc: {nproc} pipeline stages need at least {nproc} layers, the network has {layers};"
            f" use {fewer} or fewer, or finetune.strategy 'ddp'"
        )
    if tune.stages is None:
        try:
            return pipedream(flop_costs(flops), nproc).stages
        except PlanError as error:
            raise SpecError(f"finetune.stages: {error}") from None
    if tune.stages[-1] >= layers:
        raise SpecError(
            f"finetune.stages: stage starts {tune.stages} reach past the network's {layers} layers"
            f" (0..{layers - 1}); every stage needs at least one layer"
        )
    return list(itertools.pairwise([*tune.stages, layers]))


def flop_costs(flops: list[float]) -> list[LayerCost]:
    """Layer costs without a profile: forward, delta and G each as many seconds as the forward's FLOPs."""
    return [LayerCost(cost, cost, cost) for cost in flops]


def layer_costs(spec: Spec, layers: Layers, split: bool) -> list[LayerCost]:
    """Each layer's F, delta and G per micro-batch (measured, or FLOP estimates), movable or fixed."""
    if layers.costs is None:
        return flop_costs(layers.flops)
    assert spec.finetune is not None
    costs, result = layers.costs, []
    for index in range(len(layers.flops)):
        f, delta, g = costs.parts(index, split)
        movable = is_movable(costs, layers.network.layers[index], index, delta, spec.finetune.microbatches)
        result.append(LayerCost(f, delta, g, movable, costs.split_s(index)))
    return result


def is_movable(costs: TrainCosts, layer: nn.Module, index: int, delta: float, microbatches: int) -> bool:
    """LayerPipe's test: a delta that splits by channels and costs little to move (see the docstring)."""
    if index == 0 or split_channels(layer) is None or delta <= 0:
        return False
    weight, grad = costs.move_bytes(index, 1.0)
    sends = costs.send_s(weight) / microbatches + costs.send_s(grad)
    activations = microbatches * costs.batches.microbatch * costs.layers[index].output_bytes_per_sample
    return sends <= MOVE_COMM_SHARE * delta and weight <= MOVE_WEIGHT_SHARE * activations


def partitions(spec: Spec, layers: Layers, strategy: str) -> list[Partition]:
    """The partitions a pipelined strategy may run: the given stages and shares, or the partitioner's
    (every partitioner's for `auto`, which the planner then picks from by predicted step)."""
    tune, nproc = spec.finetune, spec.schedule.world_size
    assert tune is not None
    stages = stage_cuts(spec, layers.flops)  # refuses too few layers and stages past the network
    if tune.stages is not None:
        moved = given_moves(spec, layers, stages)
        return [Partition("given", stages, moved)]
    costs = layer_costs(spec, layers, split=strategy == "zb")
    names = list(PARTITIONER_FUNCTIONS) if tune.partitioner == "auto" else [tune.partitioner]
    assert layers.costs is not None or "layerpipe" not in names, "the spec refuses layerpipe without a profile"
    return [PARTITIONER_FUNCTIONS[name](costs, nproc) for name in names]


def given_moves(spec: Spec, layers: Layers, stages: list[tuple[int, int]]) -> list[float]:
    """finetune.moved, checked against the layers it moves: each share on a layer that can be split."""
    assert spec.finetune is not None
    moved = spec.finetune.moved or [0.0] * (len(stages) - 1)
    for boundary, share in enumerate(moved):
        index = stages[boundary][1] - 1
        if share == 0:
            continue
        if index == 0:
            raise SpecError(
                f"finetune.moved: share {share} at boundary {boundary}: stage 0 is layer 0 alone, whose input is"
                " the data, so it has no input gradient to move; set it to 0 or give stage 0 more layers"
            )
        if split_channels(layers.network.layers[index]) is None:
            raise SpecError(
                f"finetune.moved: share {share} at boundary {boundary} (stage {boundary} -> {boundary + 1}) would"
                f" split the delta of {layers.describe(index)}, which cannot be split by channels (only {SPLITTABLE}"
                f" can); set it to 0, or {where_splittable(layers, boundary, index)}"
            )
    return moved


def where_splittable(layers: Layers, boundary: int, index: int) -> str:
    """What would work instead: start the next stage right after the nearest layers that can be split."""
    splittable = [i for i, layer in enumerate(layers.network.layers[1:-1], start=1) if split_channels(layer)]
    if not splittable:
        return "move nothing: this network has no layer that can be split"
    nearest = sorted(sorted(splittable, key=lambda i: (abs(i - index), i))[:2])
    ends = " or ".join(layers.describe(i) for i in nearest)
    starts = " or ".join(str(i + 1) for i in nearest)
    return f"end stage {boundary} with {ends}: stage {boundary + 1} starting at {starts} in finetune.stages"


def with_channels(layers: Layers, partition: Partition) -> tuple[Partition, list[int]]:
    """The partition with each share rounded to whole input channels of its boundary layer (a planned one
    to whole blocks of CHANNEL_BLOCK where the layer has several), and the channels."""
    channels, shares = [], []
    for boundary, share in enumerate(partition.moved):
        layer = layers.network.layers[partition.stages[boundary][1] - 1]
        total = split_channels(layer) or 0
        planned = partition.partitioner != "given" and total % CHANNEL_BLOCK == 0 and total > CHANNEL_BLOCK
        block = CHANNEL_BLOCK if planned else 1
        moved = round(share * total / block) * block if share > 0 else 0
        channels.append(moved)
        shares.append(moved / total if moved else 0.0)
    rounded = Partition(partition.partitioner, partition.stages, shares, partition.target_s, partition.rounds)
    return rounded, channels


def move_record(layers: Layers, boundary: int, index: int, channels: int, microbatch: int, count: int) -> Move:
    """One move as finetune_plan.json shows it: where, how much, and the bytes it adds to each step."""
    layer = layers.network.layers[index]
    total = split_channels(layer)
    assert total is not None and isinstance(layer.weight, nn.Parameter)
    weight = layer.weight.numel() * FLOAT_BYTES * channels // total
    grad = count * microbatch * math.prod(layers.shapes[index]) * FLOAT_BYTES * channels // total
    return Move(
        boundary=boundary,
        layer=index,
        name=layers.network.names[index],
        type=type(layer).__name__,
        share=channels / total,
        channels=channels,
        of=total,
        weight_bytes_per_step=weight,
        grad_bytes_per_step=grad,
    )


def partition_details(
    spec: Spec, layers: Layers, strategy: str, partition: Partition, channels: list[int]
) -> PartitionEntry:
    """The partition as finetune_plan.json keeps it (shown on the job page)."""
    tune = spec.finetune
    assert tune is not None
    batch = tune.batch_size or spec.data.batch_size
    costs = layer_costs(spec, layers, split=strategy == "zb")
    moves = [
        move_record(layers, s, partition.stages[s][1] - 1, k, batch // tune.microbatches, tune.microbatches)
        for s, k in enumerate(channels)
        if k
    ]
    work = stage_work(costs, partition.stages, partition.moved)
    return PartitionEntry(
        partitioner=partition.partitioner,
        requested="given" if tune.stages is not None else tune.partitioner,
        measured=layers.costs is not None,  # False: the seconds are FLOP estimates
        stages=partition.stages,
        stage_work_s=[StageWork(forward=w.f, delta=w.delta, weights=w.g, total=w.total) for w in work],
        moves=moves,
        extra_bytes_per_step=sum(m.weight_bytes_per_step + m.grad_bytes_per_step for m in moves),
        layers=[(c.f, c.delta, c.g, c.movable) for c in costs],  # F, delta, G per micro-batch; movable
        target_s=partition.target_s,
        alpha_rounds=partition.rounds if partition.target_s is not None else None,
    )
