"""Per-rank action lists of the pipelined strategies, one stage per rank, written as pure functions.

An action is one micro-batch's work on one stage: F (forward), B (the whole backward), I (the input
gradient only) or W (the weight gradient, deferred). The runtime executes these lists as they are
(torch.distributed.pipelining's GPipe and 1F1B follow the same orders; zb runs through its action
runtime) and the simulator (planning/finetune_simulate.py) replays them. 3 stages, 4 micro-batches,
one tick per action, sends and receives implicit (`.` waits):

    gpipe  s0 | F0 F1 F2 F3 .  .  .  .  .  .  B0 B1 B2 B3 |
           s1 |  . F0 F1 F2 F3 .  .  .  B0 B1 B2 B3 .     |
           s2 |  .  . F0 F1 F2 F3 B0 B1 B2 B3 .  .  .     |
    1f1b   s0 | F0 F1 F2 .  .  B0 F3 .  B1 .  B2 .  B3    |   warm-up min(M, S - s) forwards,
           s1 |  . F0 F1 .  B0 F2 .  B1 F3 .  B2 .  B3    |   then a backward and a forward in turn,
           s2 |  .  . F0 B0 F1 B1 F2 B2 F3 B3             |   then the remaining backwards
    zb     like 1f1b with each B split into I (on the critical path) and W, and every W moved to the
           first moment the rank would otherwise wait (2BP / ZB-H1); chosen by a greedy list schedule
           over the stages' costs, so the lists depend on the profile (unit costs without one)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

KINDS = ("F", "B", "I", "W")


@dataclass(frozen=True, order=True)
class Action:
    kind: str  # F | B | I | W
    microbatch: int

    def __str__(self) -> str:
        return f"{self.kind}{self.microbatch}"

    @classmethod
    def parse(cls, text: str) -> Action:
        kind, microbatch = text[0], int(text[1:])
        assert kind in KINDS, f"unknown action {text!r}"
        return cls(kind, microbatch)


def gpipe(stage: int, stages: int, microbatches: int) -> list[Action]:
    """Every forward, then every backward, in micro-batch order."""
    return [Action("F", m) for m in range(microbatches)] + [Action("B", m) for m in range(microbatches)]


def one_f_one_b(stage: int, stages: int, microbatches: int) -> list[Action]:
    """torch's Schedule1F1B order: min(M, S - s) warm-up forwards, backward and forward in turn, the rest."""
    warmup = min(microbatches, stages - stage)
    actions = [Action("F", m) for m in range(warmup)]
    for m in range(microbatches - warmup):
        actions += [Action("B", m), Action("F", warmup + m)]
    actions += [Action("B", m) for m in range(microbatches - warmup, microbatches)]
    return actions


@dataclass(frozen=True)
class StageCosts:
    """Seconds of one micro-batch's forward, input gradient and weight gradient on a stage."""

    f: float = 1.0
    i: float = 1.0
    w: float = 1.0


def zero_bubble(
    stages: int, microbatches: int, costs: Sequence[StageCosts] | None = None, comm: float = 0.0
) -> list[list[Action]]:
    """2BP's schedule for one stage per rank: a greedy list schedule where each rank does, in order of
    preference, an I whose gradient has arrived, an F whose input has arrived (at most S - s forwards ahead
    of its I's, as 1F1B keeps), else a deferred W; leftover W's close the step. `comm` is the one-way
    time of a boundary tensor."""
    costs = list(costs or [StageCosts()] * stages)
    clock = [0.0] * stages
    done: dict[tuple[str, int, int], float] = {}  # (kind, stage, microbatch) -> end time
    orders: list[list[Action]] = [[] for _ in range(stages)]
    forwards, inputs, weights = [0] * stages, [0] * stages, [0] * stages
    while any(w < microbatches for w in weights):
        options = [_next_zb(s, stages, microbatches, forwards, inputs, weights, done, comm) for s in range(stages)]
        ready = [(max(clock[s], at), s, kind) for s, (kind, at) in enumerate(options) if kind is not None]
        start, stage, kind = min(ready)
        microbatch = {"F": forwards, "I": inputs, "W": weights}[kind][stage]
        cost = {"F": costs[stage].f, "I": costs[stage].i, "W": costs[stage].w}[kind]
        clock[stage] = start + cost
        done[(kind, stage, microbatch)] = clock[stage]
        {"F": forwards, "I": inputs, "W": weights}[kind][stage] += 1
        orders[stage].append(Action(kind, microbatch))
    return orders


def _next_zb(
    s: int,
    stages: int,
    microbatches: int,
    forwards: list[int],
    inputs: list[int],
    weights: list[int],
    done: dict[tuple[str, int, int], float],
    comm: float,
) -> tuple[str | None, float]:
    """What stage `s` would do next and from when it could: I, else F, else W (a W fills what would be idle)."""
    candidates = []
    m = inputs[s]
    if m < forwards[s]:
        upstream = done.get(("F", s, m)) if s == stages - 1 else done.get(("I", s + 1, m))
        if upstream is not None:
            candidates.append(("I", upstream + (comm if s < stages - 1 else 0.0)))
    m = forwards[s]
    if m < microbatches and forwards[s] - inputs[s] < stages - s:
        upstream = 0.0 if s == 0 else done.get(("F", s - 1, m))
        if upstream is not None:
            candidates.append(("F", upstream + (comm if s > 0 else 0.0)))
    if weights[s] < inputs[s]:
        candidates.append(("W", done[("I", s, weights[s])]))
    if not candidates:
        return None, float("inf")
    earliest = min(at for _, at in candidates)
    for kind in ("I", "F", "W"):  # among what can start at the earliest moment, the critical path first
        for name, at in candidates:
            if name == kind and at <= earliest:
                return name, at
    raise AssertionError("unreachable: some candidate starts at the earliest time")


def rank_actions(
    strategy: str, stages: int, microbatches: int, costs: Sequence[StageCosts] | None = None, comm: float = 0.0
) -> list[list[Action]]:
    """Every rank's action list for a pipelined strategy."""
    if strategy == "gpipe":
        return [gpipe(s, stages, microbatches) for s in range(stages)]
    if strategy == "1f1b":
        return [one_f_one_b(s, stages, microbatches) for s in range(stages)]
    if strategy == "zb":
        return zero_bubble(stages, microbatches, costs, comm)
    raise ValueError(f"{strategy!r} is not a pipelined strategy; use gpipe, 1f1b or zb")
