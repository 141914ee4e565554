"""The layer profiler of the finetune phase: every layer measured on the ranks the job will use.

Run by the `profile_finetune` phase as `torchrun ... -m pipebd_core.profile.layers --run-dir
DIR`; it writes DIR/layer_profile.json. Every rank measures every layer (so all ranks load the node as
training does) and rank 0 pools the trials. Per layer, at the micro-batch size (pipelines) and at the
largest DDP shard (ceil(B/N)): forward (F), whole backward (B) and input-gradient backward (I), each
timed without the forward that precedes it, the batched weight-gradient pass (W) as deferred.py runs
them, and the bytes autograd keeps for the backward; the first layer's input is the data, which needs
no gradient, as in training. Per layer also the bytes per sample of its output and of its input (and
input gradient), of its weight and parameters, its SGD step, and for a layer whose delta can be split
along its input channels (moved.split_channels) the input-gradient kernel whole (I_kernel) and in two
channel halves put back together (I_halves): what LayerPipe's move costs beyond the work it moves.
Between rank pairs of one node, the one-way time of each boundary tensor at the micro-batch size and of each
such weight (what a moved share sends); on several nodes, the same sizes sent between rank 0 and the next
node's first rank, fitted as the link between nodes (`inter`, latency + bytes / bandwidth); over all ranks,
the all-reduce of the whole network's gradients; and the co-run curve: one forward and backward of the
whole network at the micro-batch timed on rank 0 while k ranks run it at once, k = 1 .. N, over its time
alone (co_run; the replay shares the node by it); and the same for the whole network's optimiser step
(co_run_optim): memory-bound, it may slow differently from computing when ranks step together, as DDP's do
(VGG-16's student, 2 ranks on this 2-core machine: computing 1.09-1.20x slower together, its optimiser step
1.04x).
Each value: median of the trials after a warm-up, with its spread (p90 - p10) / median. A layer's part whose
trials disagree (spread above NOISY_SPREAD) is taken again, as the block profiler does (measure.steadiest). The
all-reduce is timed three times, spread over the profile (before, between and after the two batches' layers),
and pooled: on this 2-core machine it ran in one of two modes, about 250 or 500 ms for VGG-16's 485 MB of
gradients, each steady (spread under 0.2) for tens of seconds and then switching, within one launch and between
launches (so did 25 MB buckets, as DDP sends them); one attempt caught one mode, and two profiles of one
network disagreed by 42% on it. Pooled, a profile taken across a switch says so by its spread, which the
finetune plan's trust report (planning/trust.py) names.
"""

from __future__ import annotations

import argparse
import copy
import functools
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psutil
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record

from pipebd_core.data.datasets import build_dataset
from pipebd_core.documents.layer_profile import LayerBatches, LayerProfile, LayerProfileEntry, LayerTimes
from pipebd_core.documents.phases import PROFILE_FINETUNE
from pipebd_core.documents.profile import Timing
from pipebd_core.profile.measure import WARMUP, fit_link, ping_pong, saved_bytes, steadiest, summarise, timed_once
from pipebd_core.rank.channels import channel_dim, split_channels, weight_of, with_channels
from pipebd_core.rank.deferred import defer_weight_gradients, input_gradient
from pipebd_core.rank.network import Network, build_network, finetune_view
from pipebd_core.rank.process import exit_now, gather_on_rank_zero, join_process_group, phase_entry, pick_device
from pipebd_core.rundir import RunDir
from pipebd_core.spec import Spec, TrainSpec

P2P_MAX_ELEMENTS = 2**24  # larger tensors (a big layer's weight) are costed by scaling the largest measured


def layer_batches(spec: Spec) -> LayerBatches:
    """The batches a finetune plan can give a layer: one micro-batch, and the largest DDP shard."""
    tune, view = spec.finetune, finetune_view(spec)
    assert tune is not None
    batch, nproc = view.data.batch_size, spec.schedule.world_size  # a DDP shard: the batch over every rank
    return LayerBatches(microbatch=max(1, batch // tune.microbatches), shard=-(-batch // nproc))


@dataclass
class LayerTrials:
    """One layer at one batch on one rank: the timed trials of its parts (seconds) and its sizes (bytes)."""

    F: list[float]
    B: list[float]
    I: list[float]  # noqa: E741 (the input-gradient backward, named as F, B and W are)
    W: list[float]
    optim: list[float]
    saved_bytes: int
    output_bytes_per_sample: int
    input_bytes_per_sample: int
    param_bytes: int
    weight_bytes: int
    I_kernel: list[float] | None = None  # a splittable layer's input gradient, whole
    I_halves: list[float] | None = None  # ... and in two channel halves, put back together
    remeasured: dict[str, int] = field(default_factory=dict)  # per part: times taken again (measure.steadiest)


@dataclass
class LayerRankMeasurements:
    """Everything one rank measured, as raw trials: what it sends rank 0 to pool (all_gather_object)."""

    batches: LayerBatches
    layers: dict[str, list[LayerTrials]]  # per batch ("microbatch", "shard"), per layer
    co_run: list[float]  # rank 0's seconds of a whole step while k = 1 .. N ranks run it ([] alone)
    co_run_optim: list[float]  # rank 0's seconds of the whole network's optimiser step, likewise
    p2p: dict[int, list[float]]  # one-way seconds per tensor size (float32 elements), inside a node
    inter: list[tuple[int, float]]  # (bytes, one-way seconds) of sends to another node; rank 0 only
    allreduce: list[float]  # the whole network's gradients: three attempts, spread over the profile


def measure_layer(
    layer: nn.Module,
    shape: list[int],
    batch: int,
    trials: int,
    device: torch.device,
    first: bool,
    dtype: torch.dtype = torch.float32,
    train: TrainSpec | None = None,
) -> LayerTrials:
    """F, B, I and W of one layer at one batch, as the strategies run them (`first`: its input is the data,
    of `dtype`: token ids are zeros, which cost what any ids do), and its optimiser step as the finetune rank
    takes it (`train`: the finetune view's SGD settings; weight decay makes the step allocate a gradient copy)."""
    layer = copy.deepcopy(layer).to(device).train()
    trainable = any(p.requires_grad for p in layer.parameters())
    if dtype.is_floating_point:
        x = torch.randn((batch, *shape), device=device, requires_grad=not first)
    else:
        x = torch.zeros((batch, *shape), dtype=dtype, device=device)
    output = layer(x)
    grad = torch.randn_like(output)

    def forward() -> None:
        layer(x)

    backward = output.requires_grad
    remeasured: dict[str, int] = {}

    def part(name: str, take: Callable[[], list[float]], runs: bool = True) -> list[float]:
        """One part's trials, taken again while they disagree (measure.steadiest); zeros where it does not run."""
        if not runs:
            return [0.0] * trials
        samples, remeasured[name] = steadiest(take)
        return samples

    forward_s = part("F", lambda: timed_once(forward, trials, device))
    backward_s = part("B", lambda: timed_backward(layer, x, grad, trials, device), backward)
    kept = saved_bytes(layer, x) if trainable else 0
    weights = defer_weight_gradients(layer)
    input_s = part("I", lambda: timed_backward(layer, x, grad, trials, device), backward)
    weights.run()  # what the timed input passes kept: flushed, untimed

    def weight_passes() -> list[float]:  # one kept micro-batch per W, as the zero-bubble lists mostly run them
        return [_w_time(layer, weights, x, grad, device) for _ in range(WARMUP + trials)][WARMUP:]

    weight_s = part("W", weight_passes, bool(weights.layers))
    weights.restore()
    split = measure_split(layer, x, grad, trials, device) if not first and (split_channels(layer) or 0) > 1 else None
    optimizer = sgd(layer, train) if trainable else None
    if backward:
        layer(x).backward(grad)
    weight = getattr(layer, "weight", None)
    return LayerTrials(
        F=forward_s,
        B=backward_s,
        I=input_s,
        W=weight_s,
        optim=part("optim", lambda: timed_once(optimizer.step if optimizer else noop, trials, device), trainable),
        saved_bytes=kept,
        output_bytes_per_sample=output[0].numel() * output.element_size(),
        input_bytes_per_sample=x[0].numel() * x.element_size(),
        param_bytes=sum(p.numel() * p.element_size() for p in layer.parameters()),
        weight_bytes=weight.numel() * weight.element_size() if isinstance(weight, torch.Tensor) else 0,
        I_kernel=split[0] if split else None,
        I_halves=split[1] if split else None,
        remeasured=remeasured,
    )


def noop() -> None:
    """Nothing to time (a layer without parameters has no optimiser step)."""


def sgd(layer: nn.Module, train: TrainSpec | None) -> torch.optim.SGD:
    """The optimiser the finetune rank builds (finetune/rank.py's Trainer), over `layer` alone."""
    if train is None:
        return torch.optim.SGD(layer.parameters(), lr=0.01, momentum=0.9)
    return torch.optim.SGD(layer.parameters(), lr=train.lr, momentum=train.momentum, weight_decay=train.weight_decay)


def timed_backward(
    layer: nn.Module, x: torch.Tensor, grad: torch.Tensor, trials: int, device: torch.device
) -> list[float]:
    """Seconds of the layer's backward alone: each trial's forward runs, untimed, before it."""
    samples = []
    for index in range(WARMUP + trials):
        output = layer(x)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        output.backward(grad)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if index >= WARMUP:
            samples.append(time.perf_counter() - started)
    return samples


def measure_split(
    layer: nn.Module, x: torch.Tensor, grad: torch.Tensor, trials: int, device: torch.device
) -> tuple[list[float], list[float]]:
    """The input-gradient kernel of a splittable layer whole, and in two channel halves concatenated."""
    weight, channels = weight_of(layer).detach(), split_channels(layer)
    assert channels is not None
    half = channels // 2
    shapes = (with_channels(x.shape, layer, half), with_channels(x.shape, layer, channels - half))

    def whole() -> None:
        with torch.no_grad():
            input_gradient(layer, weight, grad, x.shape)

    def halves() -> None:
        with torch.no_grad():
            first = input_gradient(layer, weight[:, :half], grad, shapes[0])
            second = input_gradient(layer, weight[:, half:], grad, shapes[1])
            torch.cat([first, second], dim=channel_dim(layer))

    return timed_once(whole, trials, device), timed_once(halves, trials, device)


def _w_time(layer: nn.Module, weights: Any, x: torch.Tensor, grad: torch.Tensor, device: torch.device) -> float:
    """The weight pass of one kept micro-batch, timed alone (its input pass is not)."""
    layer(x).backward(grad)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    started = time.perf_counter()
    weights.run()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - started


def measure_p2p(sizes: list[int], trials: int, device: torch.device, per_node: int) -> dict[int, list[float]]:
    """One-way seconds per tensor of `size` float32 elements: ping-pong between ranks (0,1), (2,3), ... of
    one node (ranks are numbered node by node; a pair that spans two nodes measures nothing here)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    peer, result = rank ^ 1, {}
    same_node = peer < world and peer // per_node == rank // per_node
    for size in sizes if same_node else []:
        buffer = torch.zeros(max(1, size), device=device)
        trip = functools.partial(ping_pong, buffer, peer, rank % 2 == 0)
        result[size] = [t / 2 for t in timed_once(trip, trials, device)]
    dist.barrier()
    return result


def measure_inter_node(sizes: list[int], trials: int, device: torch.device, per_node: int) -> list[tuple[int, float]]:
    """(bytes, one-way seconds) of sends between rank 0 and rank `per_node`, the first rank of the next node,
    at every size a plan can send, the other ranks waiting; [] on every other rank."""
    rank = dist.get_rank()
    points: list[tuple[int, float]] = []
    if rank in (0, per_node):
        for size in sizes:
            buffer = torch.zeros(max(1, size), device=device)
            trip = functools.partial(ping_pong, buffer, per_node if rank == 0 else 0, rank == 0)
            nbytes = buffer.numel() * buffer.element_size()
            points += [(nbytes, 0.5 * seconds) for seconds in timed_once(trip, trials, device)]
    dist.barrier()
    return points if rank == 0 else []


def measure_co_run(
    network: Network,
    sample_shape: list[int],
    batch: int,
    trials: int,
    device: torch.device,
    dtype: torch.dtype,
    train: TrainSpec | None = None,
) -> tuple[list[float], list[float]]:
    """Rank 0's seconds of one forward and backward of the whole network at `batch` while k ranks run it at
    once, for k = 1 .. the world's size (the others wait): how much ranks computing together slow each
    other down on this node (on a CPU, ranks beyond its cores share them; on GPUs, nothing); then likewise
    of the whole network's optimiser step (`train`'s SGD), which shares the node's memory bandwidth."""
    rank, world = dist.get_rank(), dist.get_world_size()
    model = copy.deepcopy(network.sequential()).to(device).train()
    if dtype.is_floating_point:
        x = torch.randn((batch, *sample_shape), device=device)
    else:
        x = torch.zeros((batch, *sample_shape), dtype=dtype, device=device)

    def step() -> None:
        model(x).float().mean().backward()

    def together(fn: Callable[[], Any]) -> list[float]:
        seconds = []
        for running in range(1, world + 1):
            dist.barrier()
            samples = timed_once(fn, trials, device) if rank < running else [0.0]
            dist.barrier()
            seconds.append(statistics.median(samples))
        return seconds

    computing = together(step)  # leaves every parameter its gradient, which the optimiser steps with
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimiser = together(sgd(model, train).step) if trainable else []
    return computing, optimiser


def measure_rank(
    spec: Spec,
    network: Network,
    shapes: list[list[int]],
    trials: int,
    device: torch.device,
    data_dtype: torch.dtype = torch.float32,
) -> LayerRankMeasurements:
    batches, train = layer_batches(spec), finetune_view(spec).train
    distributed = dist.is_initialized() and dist.get_world_size() > 1
    params = sum(p.numel() for p in network.model.parameters())
    flat = torch.zeros(max(1, params), device=device)
    allreduce: list[float] = []

    def all_reduce_attempt() -> None:
        if distributed:
            allreduce.extend(timed_once(functools.partial(dist.all_reduce, flat), trials, device))

    layers: dict[str, list[LayerTrials]] = {}
    all_reduce_attempt()  # three attempts: before, between and after the two batches' layers
    for name, batch in (("microbatch", batches.microbatch), ("shard", batches.shard)):
        layers[name] = [
            measure_layer(
                layer, shapes[i], batch, trials, device, i == 0, data_dtype if i == 0 else torch.float32, train
            )
            for i, layer in enumerate(network.layers)
        ]
        all_reduce_attempt()
    sizes = {batches.microbatch * max(1, torch.Size(shape).numel()) for shape in shapes[1:-1]}
    sizes |= {min(P2P_MAX_ELEMENTS, weight_of(layer).numel()) for layer in network.layers[1:] if split_channels(layer)}
    microbatch = batches.microbatch
    co_run, co_run_optim = (
        measure_co_run(network, shapes[0], microbatch, trials, device, data_dtype, train) if distributed else ([], [])
    )
    per_node = spec.schedule.nproc
    p2p = measure_p2p(sorted(sizes), trials, device, per_node) if distributed else {}
    several = distributed and spec.schedule.nodes > 1
    inter = measure_inter_node(sorted(sizes), trials, device, per_node) if several else []
    return LayerRankMeasurements(
        batches=batches,
        layers=layers,
        co_run=co_run,
        co_run_optim=co_run_optim,
        p2p=p2p,
        inter=inter,
        allreduce=allreduce,
    )


def pool(
    measured: list[LayerRankMeasurements], spec: Spec, device: torch.device, shapes: list[list[int]]
) -> LayerProfile:
    """Every rank's trials combined into one profile."""
    first = measured[0]

    def times(batch: str, index: int) -> LayerTimes:
        found = [m.layers[batch][index] for m in measured]
        mine = found[0]

        def pooled(part: Callable[[LayerTrials], list[float] | None], name: str = "") -> Timing:
            again = max(trials.remeasured.get(name, 0) for trials in found)
            return summarise([t for trials in found for t in part(trials) or []], again)

        split = mine.I_kernel is not None
        return LayerTimes(
            F=pooled(lambda t: t.F, "F"),
            B=pooled(lambda t: t.B, "B"),
            I=pooled(lambda t: t.I, "I"),
            W=pooled(lambda t: t.W, "W"),
            optim=pooled(lambda t: t.optim, "optim"),
            I_kernel=pooled(lambda t: t.I_kernel) if split else None,
            I_halves=pooled(lambda t: t.I_halves) if mine.I_halves is not None else None,
            saved_bytes=mine.saved_bytes,
        )

    layers = []
    for index in range(len(first.layers["microbatch"])):
        sizes = first.layers["microbatch"][index]
        layers.append(
            LayerProfileEntry(
                microbatch=times("microbatch", index),
                shard=times("shard", index),
                output_bytes_per_sample=sizes.output_bytes_per_sample,
                input_bytes_per_sample=sizes.input_bytes_per_sample,
                param_bytes=sizes.param_bytes,
                weight_bytes=sizes.weight_bytes,
            )
        )
    p2p = {size: summarise([t for m in measured for t in m.p2p.get(size, [])]) for size in first.p2p}
    allreduce = [t for m in measured for t in m.allreduce]
    return LayerProfile(
        nproc=spec.schedule.world_size,
        nodes=spec.schedule.nodes,
        inter=fit_link(first.inter),
        batches=first.batches,
        device="cpu" if device.type == "cpu" else f"cuda:{torch.cuda.get_device_name(device)}",
        device_memory_bytes=_device_memory(device, spec.schedule.nproc),
        shapes=shapes,
        layers=layers,
        p2p_s=p2p,
        allreduce_s=summarise(allreduce) if allreduce else Timing(median=0.0),
        co_run=relative(first.co_run),
        co_run_optim=relative(first.co_run_optim) if first.co_run_optim else [],
        measured_at=time.time(),
        cpus=len(os.sched_getaffinity(0)) if device.type == "cpu" else None,
    )


def relative(seconds: list[float]) -> list[float]:
    """A co-run curve: each count's seconds over one rank's alone ([1.0] where nothing ran together)."""
    alone, *together = seconds or [1.0]
    return [1.0, *(value / alone for value in together)]


def _device_memory(device: torch.device, nproc: int) -> int:
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    return int(psutil.virtual_memory().total // nproc)


def profile_layers(run_dir: RunDir, trials: int) -> None:
    spec = run_dir.load_spec()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    device = pick_device(spec, int(os.environ.get("LOCAL_RANK", "0")))
    join_process_group(spec, device, world)
    network = build_network(spec, run_dir)
    sample = build_dataset(finetune_view(spec))[0][0]
    shapes = [list(sample.shape)]
    x = sample.unsqueeze(0)
    with torch.no_grad():
        network.model.eval()
        for layer in network.layers:
            x = layer(x)
            shapes.append(list(x.shape[1:]))
    measured = measure_rank(spec, network, shapes, trials, device, sample.dtype)
    gathered = gather_on_rank_zero(measured)
    if gathered is not None:
        run_dir.write_json(run_dir.layer_profile, pool(gathered, spec, device, shapes).to_json())


@record
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m pipebd_core.profile.layers", description="one rank")
    parser.add_argument("--trials", type=int, default=5, help="timed trials per measurement, after warm-up")
    phase_entry(PROFILE_FINETUNE, parser, lambda run_dir, args: profile_layers(run_dir, args.trials), argv)


if __name__ == "__main__":
    main()
    exit_now()
