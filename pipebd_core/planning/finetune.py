"""Planning the finetune phase: the network's layers and shapes, the stage cuts, every rank's actions.

`resolve_train_plan` is the `plan_finetune` phase (and, on a freshly initialised network, part of the
preflight of every launch): it checks what can only be checked against the network and the data
(labels for a cross-entropy, more stages than layers), cuts the layers into one stage per rank (the
spec's `finetune.stages`, or balanced on FLOP estimates) and writes each rank's action list.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch

from pipebd_core.data import build_dataset, check_dataset, steps_per_epoch, total_steps
from pipebd_core.flops import count_flops
from pipebd_core.plan import PlanError, StepPlan, Stream, balanced_partition
from pipebd_core.rundir import RunDir
from pipebd_core.spec import Spec, SpecError
from pipebd_core.training.network import Network, build_network
from pipebd_core.training.plan import PIPELINED, TrainPlan, finetune_view
from pipebd_core.training.schedules import rank_actions

LABEL_CHECK_SAMPLES = 8  # samples looked at for labels before a cross-entropy is accepted


def layer_probe(network: Network, sample: torch.Tensor) -> tuple[list[list[int]], list[float]]:
    """(per-sample shape entering each layer and the logits', FLOPs per sample of each layer)."""
    shapes, flops = [list(sample.shape)], []
    x = sample.unsqueeze(0)
    network.model.eval()
    with torch.no_grad():
        for index, layer in enumerate(network.layers):
            try:
                x, cost = count_flops(layer, x)
            except Exception as error:
                raise SpecError(
                    f"workload: layer {index} ({network.names[index]}) of the network to fine-tune fails on an"
                    f" input of shape {tuple(x.shape[1:])}: {type(error).__name__}: {error}"
                ) from error
            shapes.append(list(x.shape[1:]))
            flops.append(cost)
    network.model.train()
    if len(shapes[-1]) != 1:
        raise SpecError(
            f"workload: the network to fine-tune ends in shape {tuple(shapes[-1])}, not logits; its last layer"
            " must produce one score per class"
        )
    return shapes, flops


def check_labels(spec: Spec) -> None:
    """A cross-entropy needs real labels; a custom data set of bare tensors has none (label -1)."""
    dataset = build_dataset(spec)
    count = min(LABEL_CHECK_SAMPLES, len(dataset))  # type: ignore[arg-type]
    labels = [int(dataset[index][1]) for index in range(count)]
    if any(label < 0 for label in labels):
        raise SpecError(
            f"finetune.loss: '{spec.finetune.loss if spec.finetune else 'ce'}' trains to the labels, but the"
            f" {spec.data.dataset} data set has none (its items are bare tensors); give (input, label) items"
        )


def stage_cuts(spec: Spec, flops: list[float]) -> list[tuple[int, int]]:
    """One stage of contiguous layers per rank: finetune.stages, or balanced on FLOP estimates."""
    tune, layers, nproc = spec.finetune, len(flops), spec.schedule.nproc
    assert tune is not None
    if nproc > layers:
        raise SpecError(
            f"schedule.nproc: {nproc} pipeline stages need at least {nproc} layers, the network has {layers};"
            f" use --nproc {layers} or fewer, or finetune.strategy 'ddp'"
        )
    if tune.stages is None:
        try:
            return balanced_partition([3 * cost for cost in flops], nproc)
        except PlanError as error:
            raise SpecError(f"finetune.stages: {error}") from None
    if tune.stages[-1] >= layers:
        raise SpecError(
            f"finetune.stages: stage starts {tune.stages} reach past the network's {layers} layers"
            f" (0..{layers - 1}); every stage needs at least one layer"
        )
    bounds = [*tune.stages, layers]
    return list(itertools.pairwise(bounds))


def step_counts(view: Spec) -> StepPlan:
    """The finetune phase's steps over the whole training split (no held-out architecture batches)."""
    count = check_dataset(view)
    return StepPlan(total_steps(view, count), steps_per_epoch(view, count), Stream("train", 0, count))


def resolve_train_plan(spec: Spec, run_dir: RunDir | None) -> TrainPlan:
    """The finetune plan of `spec` (its network as `run_dir` holds it, or freshly initialised)."""
    tune = spec.finetune
    assert tune is not None, "only a spec with a finetune section has a finetune plan"
    view = finetune_view(spec)
    if tune.loss == "ce" or tune.alpha > 0:
        check_labels(view)
    network = build_network(spec, run_dir)
    sample = build_dataset(view)[0][0]
    shapes, flops = layer_probe(network, sample)
    strategy = "1f1b" if tune.strategy == "auto" else tune.strategy  # TODO replaced by the ranked choice
    nproc, batch = spec.schedule.nproc, view.data.batch_size
    pipelined = strategy in PIPELINED
    stages = stage_cuts(spec, flops) if pipelined else [(0, network.num_layers)]
    microbatches = tune.microbatches if pipelined else 1
    details: dict[str, Any] = {"layer_flops": flops, "requested_strategy": tune.strategy}
    return TrainPlan(
        strategy=strategy,
        nproc=nproc,
        batch_size=batch,
        microbatches=microbatches,
        stages=stages,
        steps=step_counts(view),
        shapes=shapes,
        layer_names=network.names,
        actions=rank_actions(strategy, nproc, microbatches) if pipelined else [],
        details=details,
    )
