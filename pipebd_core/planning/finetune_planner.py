"""Planning the finetune phase: the network's layers and shapes, the strategy, the stage cuts, every
rank's actions.

`resolve_train_plan` is the `plan_finetune` phase (and, on a freshly initialised network, part of the
preflight of every launch): it checks what can only be checked against the network and the data
(labels for a cross-entropy, more stages than layers), cuts the layers into one stage per rank
(planning/finetune_search.py: the spec's `finetune.stages` and `moved` shares, or its partitioner over the
measured layer costs, or over FLOP estimates without a profile) and writes each rank's action list.
With a layer profile it predicts every strategy by replaying its schedule on its partition
(planning/finetune_simulate.py; partitioner `auto`: on every partitioner's, keeping the fastest),
rejects what does not fit in memory, ranks the rest, and `auto` runs the fastest (on several nodes, the
sends between stages on different nodes and DDP's all-reduce are charged at the link between them:
planning/topology.py); the partition, the
ranking, the predicted step and stage times and the predicted timelines go into finetune_plan.json.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipebd_core.data.batches import steps_per_epoch, total_steps
from pipebd_core.data.datasets import build_dataset, check_dataset
from pipebd_core.data.streams import StepPlan, Stream
from pipebd_core.documents.finetune_plan import FinetuneDetails, FinetunePredictions, PartitionCandidate, StrategyEntry
from pipebd_core.documents.layer_profile import LayerProfile
from pipebd_core.finetune.plan import PIPELINED, TrainPlan
from pipebd_core.finetune.schedules import Action, StageCosts, rank_actions
from pipebd_core.planning.finetune_partition import Partition
from pipebd_core.planning.finetune_search import Layers, partition_details, partitions, with_channels
from pipebd_core.planning.finetune_simulate import (
    Prediction,
    TrainCosts,
    links,
    moved_times,
    simulate_ddp,
    simulate_pipeline,
)
from pipebd_core.planning.topology import Topology
from pipebd_core.planning.trust import assess_layers
from pipebd_core.rank.network import Network, build_network, finetune_view
from pipebd_core.rundir import RunDir
from pipebd_core.spec import Spec, SpecError
from pipebd_core.workloads.flops import count_flops

LABEL_CHECK_SAMPLES = 8  # samples looked at for labels before a cross-entropy is accepted


@dataclass(frozen=True)
class ProbedNetwork:
    """The network to fine-tune as planning sees it: its layers, the shape entering each layer (and the
    logits') and each layer's FLOPs per sample, probed on one sample of its data. Planning reads it and
    never changes it, so one probe serves every plan of the same network (a bench's arms: `probe_network`)."""

    network: Network
    sample: torch.Tensor
    shapes: list[list[int]]
    flops: list[float]


def probe_network(spec: Spec, run_dir: RunDir | None) -> ProbedNetwork:
    """Build `spec`'s network to fine-tune (as `run_dir` holds it, or freshly initialised) and probe it."""
    network = build_network(spec, run_dir)
    sample = build_dataset(finetune_view(spec))[0][0]
    return ProbedNetwork(network, sample, *layer_probe(network, sample))


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
    per_token = is_token_ids(sample)  # a language model: logits per token, (sequence, vocabulary)
    if len(shapes[-1]) != (2 if per_token else 1):
        what = "per token (sequence, vocabulary)" if per_token else "per class"
        raise SpecError(
            f"workload: the network to fine-tune ends in shape {tuple(shapes[-1])}, not logits; its last layer"
            f" must produce one score {what}"
        )
    return shapes, flops


def is_token_ids(sample: torch.Tensor) -> bool:
    """Whether a data sample is a sequence of token ids (a language model's), not features."""
    return not sample.dtype.is_floating_point


def check_labels(spec: Spec) -> None:
    """A cross-entropy needs real labels; a custom data set of bare tensors has none (label -1)."""
    dataset = build_dataset(spec)
    count = min(LABEL_CHECK_SAMPLES, len(dataset))  # type: ignore[arg-type]
    labels = [int(torch.as_tensor(dataset[index][1]).min()) for index in range(count)]  # one, or one per token
    if any(label < 0 for label in labels):
        raise SpecError(
            f"finetune.loss: '{spec.finetune.loss if spec.finetune else 'ce'}' trains to the labels, but the"
            f" {spec.data.dataset} data set has none (its items are bare tensors); give (input, label) items"
        )


def step_counts(view: Spec) -> StepPlan:
    """The finetune phase's steps over the whole training split (no held-out architecture batches)."""
    count = check_dataset(view)
    return StepPlan(total_steps(view, count), steps_per_epoch(view, count), Stream("train", 0, count))


def feasible(spec: Spec, strategy: str, layers: int) -> str | None:
    """Why `strategy` cannot run this spec, or None."""
    tune, nproc = spec.finetune, spec.schedule.world_size
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


@dataclass
class Candidate:
    """A strategy on one partition: its predicted step and the action lists it would run."""

    partition: Partition  # shares rounded to whole channels
    channels: list[int]  # per boundary, the input channels moved
    prediction: Prediction
    actions: list[list[Action]]


def candidates(spec: Spec, strategy: str, layers: Layers) -> list[Candidate]:
    """A strategy predicted on every partition it may run (ddp: the whole network on every rank)."""
    nproc, costs = spec.schedule.world_size, layers.costs
    assert costs is not None
    if strategy == "ddp":
        whole = Partition("whole", [(0, len(layers.flops))], [])
        return [Candidate(whole, [], simulate_ddp(costs, len(layers.flops), nproc), [])]
    return [simulate_partition(spec, strategy, layers, partition) for partition in partitions(spec, layers, strategy)]


def simulate_partition(spec: Spec, strategy: str, layers: Layers, partition: Partition) -> Candidate:
    """A pipelined strategy on one partition, its shares rounded to channels: its action lists (zb's from
    the moved stage costs) replayed."""
    costs, tune = layers.costs, spec.finetune
    assert costs is not None and tune is not None
    rounded, channels = with_channels(layers, partition)
    times = moved_times(costs, rounded.stages, rounded.moved, tune.microbatches)
    comm = max(max(link.forward, link.backward) for link in links(costs, rounded.stages, rounded.moved))
    stage_costs = [StageCosts(t.f, t.i, t.w) for t in times]
    lists = rank_actions(strategy, spec.schedule.world_size, tune.microbatches, stage_costs, comm)
    prediction = simulate_pipeline(strategy, rounded.stages, lists, costs, rounded.moved)
    return Candidate(rounded, channels, prediction, lists)


def predict(spec: Spec, strategy: str, layers: Layers) -> Candidate:
    """One strategy's predicted step on this profile: for a pipeline, on the partition its partitioner
    gives (for partitioner `auto`, on each one's, keeping the fastest)."""
    return min(candidates(spec, strategy, layers), key=lambda candidate: candidate.prediction.step_s)


def rank_strategies(spec: Spec, layers: Layers) -> list[StrategyEntry]:
    """Every strategy predicted and ranked, fastest first; those that cannot run or do not fit last."""
    ranked = []
    costs = layers.costs
    assert costs is not None
    for strategy in ("ddp", *PIPELINED):
        reason = feasible(spec, strategy, len(layers.flops))
        if reason is not None:
            ranked.append(StrategyEntry(strategy=strategy, fits=False, reason=reason))
            continue
        candidate = predict(spec, strategy, layers)
        prediction = candidate.prediction
        over = max(prediction.memory_bytes) > costs.memory_limit
        if over:
            need, have = max(prediction.memory_bytes) / 2**30, costs.memory_limit / 2**30
            reason = f"needs {need:.1f} GiB on a rank, {have:.1f} GiB there"
        entry = {
            **prediction.to_json(),
            "partitioner": candidate.partition.partitioner,
            "moved": candidate.channels,
            "fits": not over,
            "reason": reason,
            "segments": prediction.segments,
        }
        ranked.append(StrategyEntry.model_validate(entry))
    return sorted(ranked, key=lambda entry: (not entry.fits, entry.step_s or float("inf")))


def partition_candidates(spec: Spec, layers: Layers, strategy: str) -> dict[str, PartitionCandidate]:
    """Partitioner auto: what each partitioner's cut gives the chosen strategy, predicted."""
    return {
        candidate.partition.partitioner: PartitionCandidate(
            stages=candidate.partition.stages,
            moved=candidate.channels,
            step_s=candidate.prediction.step_s,
            stage_s=candidate.prediction.stage_s,
        )
        for candidate in candidates(spec, strategy, layers)
    }


def train_costs(spec: Spec, measured: LayerProfile, machines: Topology | None = None) -> TrainCosts:
    """The cost model of `measured` for the machines `spec` runs on: the profile's, or, for a job resumed on
    another rank count, the spec's nodes and ranks with the profile's layer costs and link between nodes; or
    `machines` (a what-if: `pipebd plan --nodes --link-gbps`, a stated link)."""
    machines = machines or Topology.of_layers(measured).on(spec.schedule.nodes, spec.schedule.nproc)
    return TrainCosts(measured, machines, spec.schedule.threads_per_rank)


def resolve_train_plan(
    spec: Spec,
    run_dir: RunDir | None,
    measured: LayerProfile | None = None,
    machines: Topology | None = None,
    probed: ProbedNetwork | None = None,
) -> TrainPlan:
    """The finetune plan of `spec` (its network as `run_dir` holds it, or freshly initialised), from the
    layer profile `measured` when there is one (planned for `machines` when given: `train_costs`); `probed`:
    that network already probed (`probe_network`), for a caller planning it several ways."""
    tune = spec.finetune
    assert tune is not None, "only a spec with a finetune section has a finetune plan"
    view = finetune_view(spec)
    if tune.loss == "ce" or tune.alpha > 0:
        check_labels(view)
    probe = probed or probe_network(spec, run_dir)
    network, sample = probe.network, probe.sample
    shapes, flops = [list(shape) for shape in probe.shapes], list(probe.flops)  # the plan's own, a probe shared
    layers = Layers(network, shapes, flops, train_costs(spec, measured, machines) if measured is not None else None)
    details = FinetuneDetails(layer_flops=flops, requested_strategy=tune.strategy)
    strategy = tune.strategy
    if measured is not None:
        details.profile_trust = assess_layers(measured)
    if layers.costs is not None:
        ranked = rank_strategies(spec, layers)
        details.strategies = ranked
        if strategy == "auto":
            best = ranked[0]
            if not best.fits:
                raise SpecError(f"finetune.strategy: no strategy can run this network here: {best.reason}")
            strategy = best.strategy
    assert strategy != "auto", "the spec refuses auto without a profile"
    nproc, pipelined = spec.schedule.world_size, strategy in PIPELINED
    microbatches = tune.microbatches if pipelined else 1
    if layers.costs is not None:
        candidate = predict(spec, strategy, layers)
        partition, channels, lists = candidate.partition, candidate.channels, candidate.actions
        details.predictions = FinetunePredictions.model_validate(
            {
                "predicted_step_s": candidate.prediction.step_s,
                "predicted_stage_s": candidate.prediction.stage_s,
                "simulation": candidate.prediction.segments,
            }
        )
    elif pipelined:
        (unrounded,) = partitions(spec, layers, strategy)  # without a profile: one partitioner, on FLOPs
        partition, channels = with_channels(layers, unrounded)
        lists = rank_actions(strategy, nproc, microbatches)
    else:
        partition, channels, lists = Partition("whole", [(0, network.num_layers)], []), [], []
    if pipelined:
        details.partition = partition_details(spec, layers, strategy, partition, channels)
        if tune.partitioner == "auto":
            details.partition.candidates = partition_candidates(spec, layers, strategy)
    return TrainPlan(
        strategy=strategy,
        nproc=nproc,
        batch_size=view.data.batch_size,
        microbatches=microbatches,
        stages=partition.stages,
        steps=step_counts(view),
        shapes=shapes,
        layer_names=network.names,
        input_dtype="int64" if is_token_ids(sample) else "float32",
        actions=lists,
        moved=channels if any(channels) else [],
        details=details,
    )
