"""Predicting a finetune step: the layer cost model and a replay of every strategy's real schedule.

`TrainCosts` reads a layer profile (profile/layers.py): per layer F, B, I, W and SGD-step
seconds at one micro-batch and at the largest DDP shard, bytes of outputs, input gradients, weights,
parameters and what autograd keeps, what splitting a layer's delta costs, and the one-way time of a
tensor between ranks by its size (between two nodes, the link the profile measured between them, or that
of the machines planned for: planning/topology.py). `simulate_pipeline` replays the per-rank action lists the ranks run
(finetune/schedules.py): a rank does its actions in order, each when its input has come (a forward after
the previous stage's forward of that micro-batch and the send between them; a backward after the next
stage's backward or, on the last stage, its own forward), so the waits the schedule really has, the
bubbles, come out of the replay. A send is handed over only once the receiving rank has posted its
receive, which the schedules do as the action before it ends: a tensor sent to a busy stage is
transferred after that stage's action, not during it. Ranks computing at once share the node as the
profile's co-run curve says: while k ranks compute, each works at 1 / co_run[k - 1] of its speed alone
(on a CPU node with fewer cores than ranks, 3 ranks on 2 cores each run at about 2/3; a measured curve
below what the profile's cores allow, k t / C for k ranks of t threads on C cores, is raised to it:
planning/cpu_sharing.py), and the layer times, measured with every rank computing, are that slowdown
times the work alone. A moved delta share
(planning/finetune_partition.py, finetune/moved.py) is replayed as what it is: the boundary layer's owner does
less delta work and the next stage more (each piece of the split with its own cost), the weight slice
travels with micro-batch 0's activation and each micro-batch's partial input gradient with its output
gradient. `simulate_ddp` is a forward and a backward of one
shard, the gradients' all-reduce (over ranks on several nodes, at least a ring over the link between them)
and the optimiser step. Optimiser steps, which read and write every parameter, gradient and momentum and so
are bound by memory, share the node by their own co-run curve (co_run_optim): each rank's step, its layers'
profiled steps alone, runs at 1 / co_run_optim[k - 1] while k ranks step (DDP's ranks all at once; a pipeline's
as each stage finishes its last backward). Both give the step time, each rank's busy
share and compute seconds, its peak memory estimate and Gantt segments (rank, kind, micro-batch, start,
end).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pipebd_core.documents.layer_profile import LayerBatch, LayerProfile, TimedPart
from pipebd_core.finetune.schedules import Action
from pipebd_core.planning.cpu_sharing import shared_slowdown
from pipebd_core.planning.topology import Topology, ring_allreduce_s

MEMORY_COPIES = 3  # parameters, their gradients and SGD's momentum
FINISHED = 1e-12  # seconds of work left below which (relative to the clock) an action has ended


@dataclass(frozen=True)
class StageTimes:
    f: float
    b: float
    i: float
    w: float
    optim: float
    kept_bytes: int  # what one micro-batch's forward keeps for its backward
    param_bytes: int
    held_bytes: int = 0  # besides both: a received weight slice, the buffers of received partial gradients


@dataclass(frozen=True)
class Link:
    """One-way seconds into stage s from stage s - 1: each forward's activation, the weight slice that
    travels with micro-batch 0's, and each backward's gradients going back out of s."""

    forward: float = 0.0
    weight_slice: float = 0.0
    backward: float = 0.0


class TrainCosts:
    """Seconds and bytes of layers and stages, from a layer profile."""

    def __init__(self, profile: LayerProfile, machines: Topology | None = None, threads_per_rank: int = 1) -> None:
        self.profile = profile
        self.threads_per_rank = threads_per_rank
        self.layers = profile.layers
        self.batches = profile.batches
        self.memory_limit = profile.device_memory_bytes
        # where the ranks are: the profile's machines, or those a job resumed on another rank count plans for
        self.machines = machines or Topology.of_layers(profile)

    def slowdown(self, computing: int) -> float:
        """How much slower each rank computes while `computing` ranks do than one alone: the profile's
        measured co-run curve (1 where it measured none), at least what sharing the profile's cores allows
        (on a CPU node whose core count the profile recorded)."""
        if computing < 1:
            return 1.0
        curve = self.profile.co_run
        measured = curve[min(computing, len(curve)) - 1] if curve else 1.0
        cpus = self.profile.cpus if self.profile.device == "cpu" else None
        per_node = min(computing, self.profile.nproc // max(1, self.profile.nodes))
        return max(measured, shared_slowdown(per_node * self.threads_per_rank, cpus))

    def optim_slowdown(self, stepping: int) -> float:
        """How much slower each rank's optimiser step runs while `stepping` ranks step at once than alone: the
        profile's measured curve for it (1 where it measured none)."""
        curve = self.profile.co_run_optim
        if stepping < 1 or not curve:
            return 1.0
        return curve[min(stepping, len(curve)) - 1]

    def optimiser_ends(self, starts: Sequence[float], work: Sequence[float]) -> list[float]:
        """When each rank's optimiser step ends: rank s starts at `starts[s]` with `work[s]` seconds of it alone,
        and the ranks stepping at a moment share the node by the optimiser's co-run curve."""
        left = list(work)
        ends = [start if seconds <= 0 else math.inf for start, seconds in zip(starts, work, strict=True)]
        now = min(starts, default=0.0)
        while math.inf in ends:
            waiting = [s for s, end in enumerate(ends) if end == math.inf]
            stepping = [s for s in waiting if starts[s] <= now]
            rate = 1.0 / self.optim_slowdown(len(stepping))
            finishing = min((now + left[s] / rate for s in stepping), default=math.inf)
            later = min(finishing, min((starts[s] for s in waiting if starts[s] > now), default=math.inf))
            for s in stepping:
                left[s] -= (later - now) * rate
                if left[s] <= FINISHED * max(1.0, later):
                    ends[s] = later
            now = later
        return ends

    def layer(self, index: int, batch: LayerBatch, part: TimedPart) -> float:
        return self.layers[index].at(batch).seconds(part)

    def stage(self, start: int, stop: int, batch: LayerBatch = "microbatch") -> StageTimes:
        layers = range(start, stop)
        return StageTimes(
            f=sum(self.layer(i, batch, "F") for i in layers),
            b=sum(self.layer(i, batch, "B") for i in layers),
            i=sum(self.layer(i, batch, "I") for i in layers),
            w=sum(self.layer(i, batch, "W") for i in layers),
            optim=sum(self.layer(i, batch, "optim") for i in layers),
            kept_bytes=sum(self.layers[i].at(batch).saved_bytes for i in layers),
            param_bytes=sum(self.layers[i].param_bytes for i in layers),
        )

    def send_s(self, nbytes: float, crossing: bool = False) -> float:
        """One-way seconds of a float32 tensor of `nbytes` between ranks: between nodes (`crossing`), the link
        between them, latency + bytes / bandwidth; inside a node (or with no figure for that link), the measured
        size nearest to it, scaled up linearly beyond it (0 without peers, or for nothing to send)."""
        inter, table = self.machines.inter, self.profile.p2p_s
        if nbytes <= 0:
            return 0.0
        if crossing and inter is not None:
            return inter.send_s(nbytes)
        if not table:
            return 0.0
        elements = nbytes / 4
        nearest = min(sorted(table), key=lambda size: abs(size - elements))
        return table[nearest].median * max(1.0, elements / max(1, nearest))

    def p2p(self, layer: int, crossing: bool = False) -> float:
        """One-way seconds of the tensor leaving layer `layer - 1` at one micro-batch (0 without peers), sent
        to another node when `crossing`."""
        if layer == 0:
            return 0.0
        return self.send_s(self.batches.microbatch * self.layers[layer - 1].output_bytes_per_sample, crossing)

    def parts(self, index: int, split: bool) -> tuple[float, float, float]:
        """(F, delta, G) of a layer per micro-batch: the input gradient I and weight gradient W of a split
        backward, or a whole backward B divided into its input-gradient part (at most I) and the rest."""
        f, i = self.layer(index, "microbatch", "F"), self.layer(index, "microbatch", "I")
        if split:
            return f, i, self.layer(index, "microbatch", "W")
        b = self.layer(index, "microbatch", "B")
        return f, min(i, b), b - min(i, b)

    def split_s(self, index: int) -> float:
        """What each piece of a layer's delta split in two costs beyond its share of the work: half of what
        its two channel halves (and their concatenation) took beyond the kernel computing it whole (0 where
        the profile did not measure the layer: it cannot be split)."""
        entry = self.layers[index].microbatch
        if entry.I_halves is None or entry.I_kernel is None:
            return 0.0
        return max(0.0, entry.I_halves.median - entry.I_kernel.median) / 2

    def move_bytes(self, index: int, share: float) -> tuple[int, int]:
        """(weight-slice bytes per step, partial-gradient bytes per micro-batch) of moving `share` of layer
        `index`'s delta to the next stage."""
        layer = self.layers[index]
        weight = round(share * layer.weight_bytes)
        grad = round(share * self.batches.microbatch * layer.input_bytes_per_sample)
        return weight, grad

    def allreduce(self) -> float:
        """The whole network's gradients all-reduced over every rank: as measured or, where the ranks span
        nodes, as a ring over the link between them, whichever is more."""
        measured, machines = self.profile.allreduce_s.median, self.machines
        if machines.nodes == 1 or machines.inter is None:
            return measured
        nbytes = sum(layer.param_bytes for layer in self.layers)
        return max(measured, ring_allreduce_s(nbytes, machines.ranks, machines.inter))

    def layer_work(self, index: int, split: bool) -> float:
        """What a layer costs a pipeline stage per micro-batch: F + B, or F + I + W for a split backward."""
        if split:
            split_parts: tuple[TimedPart, ...] = ("F", "I", "W")
            return sum(self.layer(index, "microbatch", part) for part in split_parts)
        return self.layer(index, "microbatch", "F") + self.layer(index, "microbatch", "B")


@dataclass
class Prediction:
    strategy: str
    stages: list[tuple[int, int]]
    step_s: float
    busy: list[float]  # per rank, the share of the step it computes
    memory_bytes: list[int]  # per rank, estimated peak
    segments: list[dict[str, Any]] = field(default_factory=list)
    stage_s: list[float] = field(default_factory=list)  # per rank, compute seconds per step (optimiser too)

    def to_json(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy,
            "stages": [list(stage) for stage in self.stages],
            "step_s": self.step_s,
            "stage_s": self.stage_s,
            "bubble": [1.0 - share for share in self.busy],
            "memory_bytes": self.memory_bytes,
        }


def moved_times(
    costs: TrainCosts, stages: list[tuple[int, int]], moved: Sequence[float], microbatches: int
) -> list[StageTimes]:
    """Each stage's times with the shares `moved` across its boundaries: the owner of a boundary layer
    loses that share of its delta (I, or B's input-gradient part), the next stage gains it, each with the
    cost of its piece of the split; the next stage holds the weight slice, the owner the buffers of the
    partial gradients."""
    times = [costs.stage(start, stop) for start, stop in stages]
    for s, share in enumerate(moved):
        if share <= 0:
            continue
        layer = stages[s][1] - 1
        _, whole, _ = costs.parts(layer, split=False)
        _, input_only, _ = costs.parts(layer, split=True)
        split, (weight, grad) = costs.split_s(layer), costs.move_bytes(layer, share)
        owner, taker = times[s], times[s + 1]
        buffers = grad * microbatches
        times[s] = replace(
            owner,
            b=owner.b - share * whole + split,
            i=owner.i - share * input_only + split,
            held_bytes=owner.held_bytes + buffers,
        )
        times[s + 1] = replace(
            taker,
            b=taker.b + share * whole + split,
            i=taker.i + share * input_only + split,
            held_bytes=taker.held_bytes + weight,
        )
    return times


def links(costs: TrainCosts, stages: list[tuple[int, int]], moved: Sequence[float]) -> list[Link]:
    """The sends into each stage from the one before (none into stage 0), with the moved shares' traffic."""
    result = [Link()]
    for s in range(1, len(stages)):
        share = moved[s - 1] if s - 1 < len(moved) else 0.0
        weight, grad = costs.move_bytes(stages[s][0] - 1, share) if share > 0 else (0, 0)
        crossing = costs.machines.crosses(s - 1, s)  # stage s runs on rank s
        boundary = costs.p2p(stages[s][0], crossing)
        result.append(Link(boundary, costs.send_s(weight, crossing), boundary + costs.send_s(grad, crossing)))
    return result


def simulate_pipeline(
    strategy: str,
    stages: list[tuple[int, int]],
    actions: list[list[Action]],
    costs: TrainCosts,
    moved: Sequence[float] = (),
) -> Prediction:
    """Replay one step of the per-rank action lists with the profiled costs and the moved shares."""
    times = moved_times(costs, stages, moved, len({action.microbatch for action in actions[0]}))
    sends = links(costs, stages, moved)
    count = len(stages)
    done: dict[tuple[str, int, int], float] = {}
    segments: list[dict[str, Any]] = []
    clock = _replay(strategy, actions, times, sends, costs, done, segments)
    stepped = costs.optimiser_ends(clock, [times[s].optim for s in range(count)])
    step = max(stepped)
    computed = [sum(seg["end"] - seg["start"] for seg in segments if seg["rank"] == s) for s in range(count)]
    busy = [seconds / step for seconds in computed]
    memory = [_pipeline_memory(actions[s], times[s]) for s in range(count)]
    stage_s = [seconds + (stepped[s] - clock[s]) for s, seconds in enumerate(computed)]
    return Prediction(strategy, stages, step, busy, memory, segments, stage_s)


@dataclass
class _Running:
    """An action a rank has taken up: when it begins (its input arrived) and the seconds of work it has left,
    as one rank computing alone would take them."""

    action: Action
    begins: float
    left: float


def _replay(
    strategy: str,
    actions: list[list[Action]],
    times: list[StageTimes],
    sends: list[Link],
    costs: TrainCosts,
    done: dict[tuple[str, int, int], float],
    segments: list[dict[str, Any]],
) -> list[float]:
    """Run the action lists to the end, filling `done` (when each action ended) and `segments`; each rank's
    clock at its last action's end. The ranks computing at a moment share the node: each works at
    1 / costs.slowdown(k) of its alone speed while k compute, and a profiled time is work done with every
    rank computing (costs.slowdown(nproc) times its alone seconds)."""
    count, profiled = len(actions), costs.slowdown(costs.profile.nproc)
    position, clock = [0] * count, [0.0] * count
    running: dict[int, _Running] = {}
    now = 0.0
    while True:
        for s in range(count):
            if s in running or position[s] == len(actions[s]):
                continue
            action = actions[s][position[s]]
            ready = _ready(action, s, count, done, sends)
            if ready is not None:
                sent, transfer = ready
                cost = {"F": times[s].f, "B": times[s].b, "I": times[s].i, "W": times[s].w}[action.kind]
                running[s] = _Running(action, max(clock[s], sent) + transfer, cost / profiled)
        if not running:
            if all(position[s] == len(actions[s]) for s in range(count)):
                return clock
            raise RuntimeError(f"the {strategy} action lists deadlock in the replay: {actions}")
        computing = [s for s, run in running.items() if run.begins <= now]
        rate = 1.0 / costs.slowdown(len(computing)) if computing else 0.0
        finishing = min((now + running[s].left / rate for s in computing), default=math.inf)
        beginning = min((run.begins for run in running.values() if run.begins > now), default=math.inf)
        later = min(finishing, beginning)
        for s in computing:
            running[s].left -= (later - now) * rate
        now = later
        for s in computing:
            run = running[s]
            if run.left <= FINISHED * max(1.0, now):
                action = run.action
                done[(action.kind, s, action.microbatch)] = clock[s] = now
                segments.append(
                    {"rank": s, "kind": action.kind, "microbatch": action.microbatch, "start": run.begins, "end": now}
                )
                position[s] += 1
                del running[s]


def _ready(
    action: Action, s: int, count: int, done: dict[tuple[str, int, int], float], sends: list[Link]
) -> tuple[float, float] | None:
    """(when the input of `action` of stage `s` is sent, the seconds its transfer takes), or None while
    it is not yet sent. A transfer starts once it is sent and the stage has posted its receive, which it
    does when its previous action ends: a tensor on its way does not arrive while the stage computes
    (gloo hands a message over only to a posted receive)."""
    m = action.microbatch
    if action.kind == "F":
        if s == 0:
            return 0.0, 0.0
        return _after(done, ("F", s - 1, m), sends[s].forward + (sends[s].weight_slice if m == 0 else 0.0))
    if action.kind in ("B", "I"):
        if s == count - 1:
            return _after(done, ("F", s, m), 0.0)
        upstream = done.get(("B", s + 1, m), done.get(("I", s + 1, m)))
        return None if upstream is None else (upstream, sends[s + 1].backward)
    return _after(done, ("I", s, m), 0.0)


def _after(
    done: dict[tuple[str, int, int], float], key: tuple[str, int, int], transfer: float
) -> tuple[float, float] | None:
    end = done.get(key)
    return None if end is None else (end, transfer)


def _pipeline_memory(actions: list[Action], times: StageTimes) -> int:
    """Weights three times over, plus the micro-batches whose activations are alive at once."""
    alive = peak = 0
    for action in actions:
        alive += 1 if action.kind == "F" else -1 if action.kind in ("B", "W") else 0
        peak = max(peak, alive)
    return MEMORY_COPIES * times.param_bytes + peak * times.kept_bytes + times.held_bytes


def simulate_ddp(costs: TrainCosts, layers: int, nproc: int) -> Prediction:
    """A forward and a backward of the largest shard, the all-reduce of every gradient, the SGD step (every rank
    steps the whole network's at once)."""
    whole = costs.stage(0, layers, "shard")
    reduce = costs.allreduce() if nproc > 1 else 0.0
    optim = whole.optim * costs.optim_slowdown(nproc)
    step = whole.f + whole.b + reduce + optim
    segments = []
    for rank in range(nproc):
        segments += [
            {"rank": rank, "kind": "F", "microbatch": 0, "start": 0.0, "end": whole.f},
            {"rank": rank, "kind": "B", "microbatch": 0, "start": whole.f, "end": whole.f + whole.b},
            {
                "rank": rank,
                "kind": "allreduce",
                "microbatch": None,
                "start": whole.f + whole.b,
                "end": whole.f + whole.b + reduce,
            },
        ]
    memory = (MEMORY_COPIES + 1) * whole.param_bytes + whole.kept_bytes  # DDP's buckets hold a gradient copy
    busy = (whole.f + whole.b) / step
    stage_s = [whole.f + whole.b + optim] * nproc
    return Prediction("ddp", [(0, layers)], step, [busy] * nproc, [memory] * nproc, segments, stage_s)
