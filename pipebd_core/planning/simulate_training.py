"""Predicting a finetune step: the layer cost model and a replay of every strategy's real schedule.

`TrainCosts` reads a layer profile (planning/layer_profiler.py): per layer F, B, I, W and SGD-step
seconds at one micro-batch and at the largest DDP shard, bytes of outputs, parameters and what autograd
keeps. `simulate_pipeline` replays the per-rank action lists the ranks run (training/schedules.py): a
rank does its actions in order, each when its input has come (a forward after the previous stage's
forward of that micro-batch and the send between them; a backward after the next stage's backward or,
on the last stage, its own forward), so the waits the schedule really has, the bubbles, come out of
the replay. `simulate_ddp` is a forward and a backward of one shard, the gradients' all-reduce and the
optimiser step. Both give the step time, each rank's busy share, its peak memory estimate and Gantt
segments (rank, kind, micro-batch, start, end).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pipebd_core.training.schedules import Action

MEMORY_COPIES = 3  # parameters, their gradients and SGD's momentum


@dataclass(frozen=True)
class StageTimes:
    f: float
    b: float
    i: float
    w: float
    optim: float
    kept_bytes: int  # what one micro-batch's forward keeps for its backward
    param_bytes: int


class TrainCosts:
    """Seconds and bytes of layers and stages, from a layer profile."""

    def __init__(self, profile: dict[str, Any]) -> None:
        self.profile = profile
        self.layers: list[dict[str, Any]] = profile["layers"]
        self.batches: dict[str, int] = profile["batches"]
        self.memory_limit = int(profile["device_memory_bytes"])

    def layer(self, index: int, batch: str, key: str) -> float:
        return float(self.layers[index][batch][key]["median"])

    def stage(self, start: int, stop: int, batch: str = "microbatch") -> StageTimes:
        layers = range(start, stop)
        return StageTimes(
            f=sum(self.layer(i, batch, "F") for i in layers),
            b=sum(self.layer(i, batch, "B") for i in layers),
            i=sum(self.layer(i, batch, "I") for i in layers),
            w=sum(self.layer(i, batch, "W") for i in layers),
            optim=sum(self.layer(i, batch, "optim") for i in layers),
            kept_bytes=sum(int(self.layers[i][batch]["saved_bytes"]) for i in layers),
            param_bytes=sum(int(self.layers[i]["param_bytes"]) for i in layers),
        )

    def p2p(self, layer: int) -> float:
        """One-way seconds of the tensor leaving layer `layer - 1` at one micro-batch (0 without peers)."""
        table = self.profile.get("p2p_s") or {}
        if not table or layer == 0:
            return 0.0
        elements = self.batches["microbatch"] * self.layers[layer - 1]["output_bytes_per_sample"] // 4
        sizes = sorted(int(size) for size in table)
        nearest = min(sizes, key=lambda size: abs(size - elements))
        return float(table[str(nearest)]["median"]) * max(1.0, elements / max(1, nearest))

    def allreduce(self) -> float:
        return float(self.profile["allreduce_s"]["median"])

    def layer_work(self, index: int, split: bool) -> float:
        """What a layer costs a pipeline stage per micro-batch: F + B, or F + I + W for a split backward."""
        if split:
            return sum(self.layer(index, "microbatch", key) for key in ("F", "I", "W"))
        return self.layer(index, "microbatch", "F") + self.layer(index, "microbatch", "B")


@dataclass
class Prediction:
    strategy: str
    stages: list[tuple[int, int]]
    step_s: float
    busy: list[float]  # per rank, the share of the step it computes
    memory_bytes: list[int]  # per rank, estimated peak
    segments: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy,
            "stages": [list(stage) for stage in self.stages],
            "step_s": self.step_s,
            "bubble": [1.0 - share for share in self.busy],
            "memory_bytes": self.memory_bytes,
        }


def simulate_pipeline(
    strategy: str,
    stages: list[tuple[int, int]],
    actions: list[list[Action]],
    costs: TrainCosts,
) -> Prediction:
    """Replay one step of the per-rank action lists with the profiled costs."""
    times = [costs.stage(start, stop) for start, stop in stages]
    sends = [costs.p2p(start) for start, _ in stages]  # into stage s (forward) and out of it (backward)
    count = len(stages)
    done: dict[tuple[str, int, int], float] = {}
    clock, position = [0.0] * count, [0] * count
    segments: list[dict[str, Any]] = []
    while any(position[s] < len(actions[s]) for s in range(count)):
        moved = False
        for s in range(count):
            while position[s] < len(actions[s]):
                action = actions[s][position[s]]
                ready = _ready(action, s, count, done, sends)
                if ready is None:
                    break
                start = max(clock[s], ready)
                cost = {"F": times[s].f, "B": times[s].b, "I": times[s].i, "W": times[s].w}[action.kind]
                clock[s] = start + cost
                done[(action.kind, s, action.microbatch)] = clock[s]
                segments.append(
                    {"rank": s, "kind": action.kind, "microbatch": action.microbatch, "start": start, "end": clock[s]}
                )
                position[s] += 1
                moved = True
        if not moved:
            raise RuntimeError(f"the {strategy} action lists deadlock in the replay: {actions}")
    step = max(clock[s] + times[s].optim for s in range(count))
    busy = [sum(seg["end"] - seg["start"] for seg in segments if seg["rank"] == s) / step for s in range(count)]
    memory = [_pipeline_memory(actions[s], times[s]) for s in range(count)]
    return Prediction(strategy, stages, step, busy, memory, segments)


def _ready(
    action: Action, s: int, count: int, done: dict[tuple[str, int, int], float], sends: list[float]
) -> float | None:
    """When `action` of stage `s` can start as far as other stages go, or None while it cannot yet."""
    m = action.microbatch
    if action.kind == "F":
        return 0.0 if s == 0 else _after(done, ("F", s - 1, m), sends[s])
    if action.kind in ("B", "I"):
        if s == count - 1:
            return _after(done, ("F", s, m), 0.0)
        upstream = done.get(("B", s + 1, m), done.get(("I", s + 1, m)))
        return None if upstream is None else upstream + sends[s + 1]
    return _after(done, ("I", s, m), 0.0)


def _after(done: dict[tuple[str, int, int], float], key: tuple[str, int, int], delay: float) -> float | None:
    end = done.get(key)
    return None if end is None else end + delay


def _pipeline_memory(actions: list[Action], times: StageTimes) -> int:
    """Weights three times over, plus the micro-batches whose activations are alive at once."""
    alive = peak = 0
    for action in actions:
        alive += 1 if action.kind == "F" else -1 if action.kind in ("B", "W") else 0
        peak = max(peak, alive)
    return MEMORY_COPIES * times.param_bytes + peak * times.kept_bytes


def simulate_ddp(costs: TrainCosts, layers: int, nproc: int) -> Prediction:
    """A forward and a backward of the largest shard, the all-reduce of every gradient, the SGD step."""
    whole = costs.stage(0, layers, "shard")
    reduce = costs.allreduce() if nproc > 1 else 0.0
    step = whole.f + whole.b + reduce + whole.optim
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
    return Prediction("ddp", [(0, layers)], step, [busy] * nproc, [memory] * nproc, segments)
