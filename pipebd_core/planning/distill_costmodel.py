"""The cost model: step time and peak memory of a stage, a plan and every mode, from a profile.

A stage owning blocks [start, stop) on k replicas runs each block at the per-replica batch
b = ceil(B/k) (its largest shard). Its time per step is the sum over its blocks of teacher and
student (forward, backward, update) time at b (for k > 1, the student step as a replicated stage runs
it: its BatchNorm synchronised over the k ranks, profiled with every group at once), plus the
all-reduce of its students' gradients when k > 1, plus loading its input (first stage) or receiving
it (later stages). With decoupled updates the pipeline runs at the pace of its slowest stage. When
architecture updates run (nas), one step in `arch_every` repeats the loading, relaying and teacher
work on a held-out batch and adds the students' architecture step; predictions describe that search
phase (after the warm-up).

On several nodes (topology.py) a stage's cost depends on where it lies: receiving its input over the link
between nodes when a producer rank is on another node, its all-reduce as a ring over that link when its
replicas span nodes. `stage` without a placement is the stage inside one node; `placed` charges the links.
A group larger than the profile measured (a what-if on more ranks) takes the largest measured all-reduce,
scaled as a ring's traffic grows, 2 (k - 1) / k.

On a CPU node the profile's seconds were measured with every rank (and whatever else its conditions
recorded) sharing the cores (cpu_sharing.py); a run of these plans has every rank computing and nothing
else. Every second of an uncalibrated profile (teacher, student, loading, relaying, all-reduce) is scaled by the run's
slowdown over the profile's (`sharing`): 1 where the profile's ranks had a core each and nothing else ran.
A calibrated profile is used as it is: its multipliers turn the profile's seconds into training's own.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from pipebd_core.documents.profile import BlockProfile, Profile, Timing
from pipebd_core.planning.balance import longest_first_assignment
from pipebd_core.planning.cpu_sharing import profiled_share, shared_slowdown
from pipebd_core.planning.topology import Topology, ring_allreduce_s


@dataclass(frozen=True)
class StageCost:
    start: int
    stop: int
    replicas: int
    input_s: float  # loading (first stage) or receiving the input rows
    compute_s: float  # teacher + student work of every block
    allreduce_s: float
    memory_bytes: int
    overhead_s: float = 0.0  # per step beyond the work (calibrated: calibration.py)

    @property
    def total_s(self) -> float:
        return self.input_s + self.compute_s + self.allreduce_s + self.overhead_s


def at_batch(table: Mapping[int, Timing] | Mapping[int, int], batch: int) -> float:
    """A measured value (a Timing's median, or bytes) at `batch`; between profiled sizes (a shard one row
    smaller than the largest), the nearest larger measurement scaled linearly by the rows."""
    entry = table.get(batch)
    if entry is not None:
        return float(entry.median if isinstance(entry, Timing) else entry)
    nearest = nearest_measured(table, batch)
    return at_batch(table, nearest) * batch / nearest


def nearest_measured(sizes: Collection[int], batch: int) -> int:
    """`batch` where it was measured, else the nearest larger measured size, else the largest."""
    if batch in sizes:
        return batch
    ordered = sorted(sizes)
    return next((size for size in ordered if size >= batch), ordered[-1])


def profiled_student(block: BlockProfile, batch: int, replicas: int, batch_size: int, round_: str = "weights") -> float:
    """A block's profiled student step at `batch` rows on a stage of `replicas` (uncalibrated). On k > 1
    replicas, the step measured with its BatchNorm synchronised over k ranks (student_group_s, at ceil(B/k)
    rows, scaled by the rows for a smaller shard); an architecture round by the same factor over its plain
    step. A profile without that measurement (written by hand) gives the plain step."""
    arch = block.student_arch_s
    plain_table = arch if round_ == "arch" and any(entry.trials for entry in arch.values()) else block.student_s
    plain = at_batch(plain_table, batch)
    group = block.student_group_s.get(replicas) if replicas > 1 else None
    if group is None or group.trials == 0:
        return plain
    shard = -(-batch_size // replicas)
    replicated = group.median * batch / shard
    if plain_table is block.student_s:
        return replicated
    step = at_batch(block.student_s, batch)
    return plain * replicated / step if step > 0 else plain


def chain_factors(profile: Profile) -> dict[int, float]:
    """Per measured batch, what the blocks' work costs in a training step over what it cost timed each in a
    loop of its own: the blocks run one after another (chain_s) over the sum of their teacher and student
    times. Empty where the chain was not measured (GPU profiles, profiles written before it) and for a
    calibrated profile, whose factors were measured in training and include it."""
    if profile.calibration is not None:
        return {}
    factors = {}
    for size, chain in profile.chain_s.items():
        alone = sum(at_batch(block.teacher_s, size) + at_batch(block.student_s, size) for block in profile.blocks)
        if chain.trials and alone > 0:
            factors[size] = chain.median / alone
    return factors


@dataclass(frozen=True)
class Scales:
    """Multipliers from a profile's calibration (calibration.py); all 1 for a profile training has not
    calibrated."""

    teacher: list[float]
    student: list[float]
    data: float = 1.0
    allreduce: float = 1.0
    task_overhead_s: float = 0.0  # seconds a task costs beyond its blocks, loading and all-reduce

    @classmethod
    def of(cls, profile: Profile) -> Scales:
        count = len(profile.blocks)
        calibration = profile.calibration
        if calibration is None:
            return cls([1.0] * count, [1.0] * count)
        blocks = calibration.blocks
        return cls(
            [blocks[b].teacher or 1.0 for b in range(count)],
            [blocks[b].student or 1.0 for b in range(count)],
            calibration.data or 1.0,
            calibration.allreduce or 1.0,
            calibration.task_overhead_s or 0.0,
        )


class CostModel:
    """Answers "how long, how much memory" for blocks, stages and modes from one profile (calibrated by
    training's measurements when the profile carries them)."""

    def __init__(
        self,
        profile: Profile,
        arch_every: int | None = None,
        topology: Topology | None = None,
        threads_per_rank: int = 1,
    ) -> None:
        self.profile = profile
        self.topology = topology or Topology.of(profile)  # the machines to plan for (default: the profile's)
        self.scales = Scales.of(profile)
        self.sharing = cpu_sharing(profile, self.topology, threads_per_rank)
        self.chain_factors = chain_factors(profile)
        self.arch_every = arch_every
        arch_fraction = 1.0 / arch_every if arch_every else 0.0
        self.arch_fraction = arch_fraction
        self.repeat = 1.0 + arch_fraction  # teacher, loading and relaying run again in each arch round
        self.batch_size = profile.batch_size
        self.nproc = self.topology.ranks
        self.blocks = profile.blocks
        self.num_blocks = len(self.blocks)
        self.memory_limit = profile.device_memory_bytes

    @property
    def task_overhead(self) -> float:
        """Seconds each task costs beyond its blocks, loading and all-reduce (0 until calibrated)."""
        return self.scales.task_overhead_s

    def per_replica(self, replicas: int) -> int:
        return math.ceil(self.batch_size / replicas)

    def shared(self, scale: float) -> float:
        """The multiplier of a profiled second: its calibration times the run's sharing of the cores over
        the profile's (1 for a calibrated profile)."""
        return scale * self.sharing

    def chain(self, batch: int) -> float:
        """The blocks' cost in a training step over their profiled cost, at the nearest measured batch (1
        where not measured: chain_factors)."""
        if not self.chain_factors:
            return 1.0
        return self.chain_factors[nearest_measured(self.chain_factors, batch)]

    def teacher(self, block: int, batch: int) -> float:
        profiled = at_batch(self.blocks[block].teacher_s, batch) * self.chain(batch)
        return profiled * self.shared(self.scales.teacher[block])

    def student(self, block: int, batch: int, round_: str = "weights", replicas: int = 1) -> float:
        """A student step at `batch` rows on a stage of `replicas` (see profiled_student), in a training step
        (chain), calibrated."""
        profiled = profiled_student(self.blocks[block], batch, replicas, self.batch_size, round_)
        return profiled * self.chain(batch) * self.shared(self.scales.student[block])

    def student_step(self, block: int, batch: int, replicas: int = 1) -> float:
        """A block's student work per step, architecture rounds included."""
        return self.student(block, batch, replicas=replicas) + self.arch_fraction * self.student(
            block, batch, "arch", replicas
        )

    def data(self, batch: int) -> float:
        return at_batch(self.profile.data_s, batch) * self.shared(self.scales.data)

    def p2p(self, boundary: int, batch: int, crosses: bool = False) -> float:
        """Receiving `batch` rows at `boundary`: inside a node as profiled, between nodes over the link."""
        inter = self.topology.inter
        if crosses and inter is not None:
            return inter.send_s(self.activation_bytes(boundary, batch))
        return at_batch(self.profile.p2p_s[boundary], batch) * self.sharing

    def allreduce(self, block: int, replicas: int, spans: bool = False) -> float:
        """The all-reduce of a block's gradients over `replicas` ranks (`spans`: on more than one node)."""
        if replicas <= 1:
            return 0.0
        seconds = profiled_allreduce(self.blocks[block], replicas)
        inter = self.topology.inter
        if spans and inter is not None:
            seconds = max(seconds, ring_allreduce_s(self.blocks[block].student_param_bytes, replicas, inter))
        return seconds * self.shared(self.scales.allreduce)

    def activation_bytes(self, boundary: int, batch: int) -> int:
        return batch * self.profile.boundary_bytes_per_sample[boundary]

    def backward_bytes(self, block: int, batch: int) -> int:
        """What a student step adds at its peak: measured on CUDA, else the tensors autograd keeps."""
        saved = at_batch(self.blocks[block].saved_bytes, batch)
        peak = self.blocks[block].student_peak_bytes
        return int(max(saved, at_batch(peak, batch))) if peak else int(saved)

    def stage(self, start: int, stop: int, replicas: int) -> StageCost:
        batch = self.per_replica(replicas)
        blocks = range(start, stop)
        return StageCost(
            start=start,
            stop=stop,
            replicas=replicas,
            input_s=self.repeat * (self.data(batch) if start == 0 else self.p2p(start, batch)),
            compute_s=sum(self.repeat * self.teacher(b, batch) + self.student_step(b, batch, replicas) for b in blocks),
            allreduce_s=sum(self.allreduce(b, replicas) for b in blocks),
            memory_bytes=self.stage_memory(start, stop, replicas),
            overhead_s=self.repeat * self.task_overhead,
        )

    def placed(self, cost: StageCost, first_rank: int, producer: Sequence[int] = ()) -> StageCost:
        """`cost` (a stage inside one node) on ranks first_rank.. , fed by `producer`'s ranks: its receive
        and all-reduce charged by the links they cross."""
        if self.topology.nodes == 1:
            return cost
        ranks = range(first_rank, first_rank + cost.replicas)
        input_s, allreduce_s = cost.input_s, cost.allreduce_s
        if cost.start > 0 and self.topology.receive_crosses(producer, ranks, self.batch_size):
            input_s = self.repeat * self.p2p(cost.start, self.per_replica(cost.replicas), crosses=True)
        if self.topology.spans(ranks):
            allreduce_s = sum(self.allreduce(b, cost.replicas, spans=True) for b in range(cost.start, cost.stop))
        return dataclasses.replace(cost, input_s=input_s, allreduce_s=allreduce_s)

    def placed_stages(self, stages: Sequence[tuple[int, int, int]]) -> list[StageCost]:
        """Every stage of a plan (blocks [start, stop) on k ranks, ranks given in order) where it lies."""
        costs, first, producer = [], 0, range(0)
        for start, stop, replicas in stages:
            costs.append(self.placed(self.stage(start, stop, replicas), first, producer))
            producer = range(first, first + replicas)
            first += replicas
        return costs

    def stage_memory(self, start: int, stop: int, replicas: int) -> int:
        """Process baseline, weights (students x3: parameters, gradients, momentum), the stage's teacher
        activations, a receive posted ahead, two sends in flight, and the largest student backward."""
        batch = self.per_replica(replicas)
        blocks = range(start, stop)
        weights = sum(self.blocks[b].teacher_param_bytes + 3 * self.blocks[b].student_param_bytes for b in blocks)
        activations = sum(self.activation_bytes(boundary, batch) for boundary in range(start, stop + 1))
        relay = (self.activation_bytes(start, batch) if start > 0 else 0) + (
            2 * self.activation_bytes(stop, batch) if stop < self.num_blocks else 0
        )
        backward = max(self.backward_bytes(b, batch) for b in blocks)
        return int(self.profile.baseline_bytes + weights + activations + relay + backward)

    def fits(self, cost: StageCost) -> bool:
        return cost.memory_bytes <= self.memory_limit

    def ideal_step(self) -> float:
        """All teacher and student work at full batch, shared perfectly by every rank."""
        batch = self.batch_size
        work = sum(self.repeat * self.teacher(b, batch) + self.student_step(b, batch) for b in range(self.num_blocks))
        return work / self.nproc

    def dp_step(self) -> float:
        """Per global step: every block in turn, teacher re-run from the input, on 1/N of the batch."""
        batch = self.per_replica(self.nproc)
        total = 0.0
        for block in range(self.num_blocks):
            prefix = sum(self.teacher(b, batch) for b in range(block + 1))
            total += self.repeat * (self.data(batch) + prefix + self.task_overhead)
            spans = self.topology.nodes > 1
            total += self.student_step(block, batch, self.nproc) + self.allreduce(block, self.nproc, spans)
        return total

    def ls_costs(self) -> list[float]:
        """What each block costs as a layerwise task: load, teacher prefix, student, at full batch."""
        batch = self.batch_size
        prefix = [sum(self.teacher(b, batch) for b in range(block + 1)) for block in range(self.num_blocks)]
        return [
            self.repeat * (self.data(batch) + prefix[block] + self.task_overhead) + self.student_step(block, batch)
            for block in range(self.num_blocks)
        ]

    def ls_assignment(self) -> list[list[int]]:
        return longest_first_assignment(self.ls_costs(), self.nproc)

    def ls_step(self) -> float:
        costs = self.ls_costs()
        return max(sum(costs[b] for b in blocks) for blocks in self.ls_assignment())

    def pipeline_step(self, stages: list[tuple[int, int, int]]) -> float:
        """Decoupled updates: the slowest stage (where it lies) sets the pace."""
        return max(cost.total_s for cost in self.placed_stages(stages))


def cpu_sharing(profile: Profile, machines: Topology, threads_per_rank: int = 1) -> float:
    """The run's slowdown from ranks sharing a CPU node's cores over the one the profile's seconds carry
    (cpu_sharing.py); 1 on GPUs, for a profile without its conditions, and for a calibrated one."""
    conditions = profile.conditions
    if profile.device != "cpu" or conditions is None or profile.calibration is not None:
        return 1.0
    profiled = profiled_share(
        profile.nproc // max(1, profile.nodes), threads_per_rank, conditions.cpus, conditions.other_cpu_cores
    )
    running = shared_slowdown(machines.per_node * threads_per_rank, conditions.cpus)
    return running / profiled


def profiled_allreduce(block: BlockProfile, replicas: int) -> float:
    """The all-reduce of `block`'s gradients over `replicas` ranks of one node, from its profile: as measured,
    or, for a larger group than profiled, the largest measured one scaled as a ring's traffic; 0.0 where no
    group was profiled (a profile measured on one rank: the job's first node, before it grew)."""
    measured = block.allreduce_s
    entry = measured.get(replicas)
    if entry is not None and entry.trials:
        return entry.median
    largest = max((k for k, timing in measured.items() if timing.trials), default=None)
    traffic = (replicas - 1) / replicas
    return 0.0 if largest is None else measured[largest].median * traffic * largest / (largest - 1)
