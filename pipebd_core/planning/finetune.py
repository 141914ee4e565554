"""Planning the finetune phase: the network's layers and shapes, the strategy, the stage cuts, every
rank's actions.

`resolve_train_plan` is the `plan_finetune` phase (and, on a freshly initialised network, part of the
preflight of every launch): it checks what can only be checked against the network and the data
(labels for a cross-entropy, more stages than layers), cuts the layers into one stage per rank (the
spec's `finetune.stages`, or the exact min-max cut of the measured per-layer work, or of FLOP
estimates without a profile) and writes each rank's action list. With a layer profile it predicts
every strategy by replaying its schedule (planning/simulate_training.py), rejects what does not fit in
memory, ranks the rest, and `auto` runs the fastest; the ranking, the predicted step and the
predicted timelines go into finetune_plan.json.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch

from pipebd_core.data import build_dataset, check_dataset, steps_per_epoch, total_steps
from pipebd_core.flops import count_flops
from pipebd_core.plan import PlanError, StepPlan, Stream, balanced_partition
from pipebd_core.planning.simulate_training import Prediction, TrainCosts, simulate_ddp, simulate_pipeline
from pipebd_core.rundir import RunDir
from pipebd_core.spec import Spec, SpecError
from pipebd_core.training.network import Network, build_network
from pipebd_core.training.plan import PIPELINED, TrainPlan, finetune_view
from pipebd_core.training.schedules import Action, StageCosts, rank_actions

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


def pipeline_cuts(spec: Spec, costs: TrainCosts | None, flops: list[float], split: bool) -> list[tuple[int, int]]:
    """The stages of a pipelined strategy: finetune.stages, else the min-max cut of the measured work
    per layer (F + B, or F + I + W for a split backward), else of FLOP estimates."""
    assert spec.finetune is not None
    if spec.finetune.stages is not None or costs is None:
        return stage_cuts(spec, flops)
    work = [costs.layer_work(index, split) for index in range(len(flops))]
    stage_cuts(spec, flops)  # the same refusals as without a profile (too few layers)
    return balanced_partition(work, spec.schedule.nproc)


def feasible(spec: Spec, strategy: str, layers: int) -> str | None:
    """Why `strategy` cannot run this spec, or None."""
    tune, nproc = spec.finetune, spec.schedule.nproc
    assert tune is not None
    batch = tune.batch_size or spec.data.batch_size
    if strategy == "ddp":
        return f"a batch of {batch} does not split over {nproc} ranks" if batch < nproc else None
    if layers < nproc:
        return f"{nproc} stages need {nproc} layers, the network has {layers}"
    if batch % tune.microbatches:
        return f"a batch of {batch} does not split into {tune.microbatches} micro-batches"
    if strategy in ("1f1b", "zb") and tune.microbatches < nproc:
        return f"{strategy} needs at least {nproc} micro-batches, the spec has {tune.microbatches}"
    return None


def predict(spec: Spec, strategy: str, costs: TrainCosts, flops: list[float]) -> tuple[Prediction, list[list[Action]]]:
    """One strategy's predicted step on this profile, with the action lists it would run."""
    nproc, layers = spec.schedule.nproc, len(flops)
    if strategy == "ddp":
        return simulate_ddp(costs, layers, nproc), []
    assert spec.finetune is not None
    stages = pipeline_cuts(spec, costs, flops, split=strategy == "zb")
    times = [costs.stage(start, stop) for start, stop in stages]
    comm = max((costs.p2p(start) for start, _ in stages), default=0.0)
    lists = rank_actions(strategy, nproc, spec.finetune.microbatches, [StageCosts(t.f, t.i, t.w) for t in times], comm)
    return simulate_pipeline(strategy, stages, lists, costs), lists


def rank_strategies(spec: Spec, costs: TrainCosts, flops: list[float]) -> list[dict[str, Any]]:
    """Every strategy predicted and ranked, fastest first; those that cannot run or do not fit last."""
    ranked = []
    for strategy in ("ddp", *PIPELINED):
        reason = feasible(spec, strategy, len(flops))
        if reason is not None:
            ranked.append({"strategy": strategy, "fits": False, "reason": reason})
            continue
        prediction, _ = predict(spec, strategy, costs, flops)
        over = max(prediction.memory_bytes) > costs.memory_limit
        entry = {**prediction.to_json(), "fits": not over, "segments": prediction.segments}
        if over:
            need, have = max(prediction.memory_bytes) / 2**30, costs.memory_limit / 2**30
            entry["reason"] = f"needs {need:.1f} GiB on a rank, {have:.1f} GiB there"
        ranked.append(entry)
    return sorted(ranked, key=lambda entry: (not entry["fits"], entry.get("step_s", float("inf"))))


def resolve_train_plan(spec: Spec, run_dir: RunDir | None, measured: dict[str, Any] | None = None) -> TrainPlan:
    """The finetune plan of `spec` (its network as `run_dir` holds it, or freshly initialised), from the
    layer profile `measured` when there is one."""
    tune = spec.finetune
    assert tune is not None, "only a spec with a finetune section has a finetune plan"
    view = finetune_view(spec)
    if tune.loss == "ce" or tune.alpha > 0:
        check_labels(view)
    network = build_network(spec, run_dir)
    sample = build_dataset(view)[0][0]
    shapes, flops = layer_probe(network, sample)
    costs = TrainCosts(measured) if measured is not None else None
    details: dict[str, Any] = {"layer_flops": flops, "requested_strategy": tune.strategy}
    strategy = tune.strategy
    if costs is not None:
        ranked = rank_strategies(spec, costs, flops)
        details["strategies"] = ranked
        if strategy == "auto":
            best = ranked[0]
            if not best["fits"]:
                raise SpecError(f"finetune.strategy: no strategy can run this network here: {best.get('reason')}")
            strategy = best["strategy"]
    assert strategy != "auto", "the spec refuses auto without a profile"
    nproc, pipelined = spec.schedule.nproc, strategy in PIPELINED
    if pipelined:
        stage_cuts(spec, flops)  # refuses more stages than layers, or stages past the network, naming the field
    microbatches = tune.microbatches if pipelined else 1
    if costs is not None:
        prediction, lists = predict(spec, strategy, costs, flops)
        stages = prediction.stages
        details.update(predicted_step_s=prediction.step_s, simulation=prediction.segments)
    else:
        stages = stage_cuts(spec, flops) if pipelined else [(0, network.num_layers)]
        lists = rank_actions(strategy, nproc, microbatches) if pipelined else []
    return TrainPlan(
        strategy=strategy,
        nproc=nproc,
        batch_size=view.data.batch_size,
        microbatches=microbatches,
        stages=stages,
        steps=step_counts(view),
        shapes=shapes,
        layer_names=network.names,
        actions=lists,
        details=details,
    )
