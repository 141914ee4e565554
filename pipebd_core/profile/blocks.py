"""The profiler: measures every block on the devices the job will use, with every rank busy.

Run by the job's `profile` phase as `torchrun ... -m pipebd_core.profile.blocks --run-dir DIR`: it
reads DIR/spec.json, and each rank measures every block (so all ranks load the node as training
does); rank 0 pools every rank's trials and writes DIR/profile.json. Per block and per per-replica
batch size b = ceil(B/k), k = 1..N: teacher forward time, student forward+backward+update time, and
the bytes the student's backward keeps alive; per boundary, point-to-point time between rank pairs of
one node (and, from those sends, the node's link: latency and bandwidth; across nodes, the link between
them, from sends between rank 0 and the first rank of the next node at the same sizes);
per group size k, the student step of each block as a replicated stage runs it (at ceil(B/k) rows, its
BatchNorm normalising over the group's shards: a collective per layer, forward and backward) and the
all-reduce time of its gradients; the time to load b samples; the bytes
per sample of every boundary tensor as the blocks produce it; on CUDA, the peak memory of each
student step. Each value is the median of all trials (after warm-up) and comes with its spread
(p90 - p10) / median.

A measurement a rank takes alone (blocks, data loading) whose trials disagree (spread above
NOISY_SPREAD) is taken again, up to MAX_REMEASURES times, keeping the steadiest attempt; collective
ones (sends, all-reduces, replicated student steps) are taken once, since every rank must run the same
trials. The profile's
`conditions` say under what load it was taken: the CPU time other processes used on the node while
the ranks measured, the load average and, on GPUs, other processes on each device (trust.py judges)."""

from __future__ import annotations

import argparse
import copy
import functools
import importlib
import itertools
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Self

import psutil
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record

from pipebd_core.data.batches import BatchLoader
from pipebd_core.data.datasets import build_dataset
from pipebd_core.documents.phases import PROFILE
from pipebd_core.documents.profile import BlockProfile, Conditions, LinkFit, Profile, Timing
from pipebd_core.profile.measure import (
    MAX_REMEASURES,
    NOISY_SPREAD,
    WARMUP,
    fit_link,
    ping_pong,
    saved_bytes,
    steadiest,
    summarise,
    timed_once,
)
from pipebd_core.rank.batchnorm import with_sync_batchnorm
from pipebd_core.rank.process import exit_now, gather_on_rank_zero, join_process_group, phase_entry, pick_device
from pipebd_core.rank.students import StudentBlock
from pipebd_core.rundir import RunDir
from pipebd_core.spec import Spec
from pipebd_core.workloads.candidates import Candidates, replaced_layer
from pipebd_core.workloads.probe import BlockProbe, block_input, probe_workload
from pipebd_core.workloads.workload import Workload, build_workload


def profile_batch_sizes(batch_size: int, nproc: int) -> list[int]:
    """Every per-replica batch a plan can give a block: the largest shard of B over k replicas."""
    return sorted({-(-batch_size // k) for k in range(1, min(nproc, batch_size) + 1)}, reverse=True)


@dataclass
class Trials:
    """One measurement's timed trials, and how many times it was taken again because they disagreed."""

    samples: list[float]
    remeasured: int = 0

    def scaled(self, factor: float) -> Trials:
        return Trials([sample * factor for sample in self.samples], self.remeasured)


@dataclass
class BlockMeasurement:
    """One block at one batch on one rank: its timed trials, and the bytes it keeps and sends."""

    teacher: Trials  # the teacher's forward
    student: Trials  # the student's forward, backward and update (a weight round)
    saved_bytes: int  # what the student's backward keeps alive
    output_bytes_per_sample: int  # the block's output, per sample
    student_arch: Trials | None = None  # a supernet: its architecture round
    candidate_forward: list[Trials] = field(default_factory=list)  # a search's block (full batch): each candidate
    layer_forward: Trials | None = None  # ... and the teacher layer it replaces, alone
    student_peak_bytes: int | None = None  # CUDA: the student step's peak memory


@dataclass
class CpuUse:
    """CPU seconds while a rank measured: wall time, the whole node's busy time, this rank's own."""

    wall_s: float
    node_busy_s: float
    own_s: float


@dataclass
class RankLoad:
    """What else ran while a rank measured: CPU use, and other processes on its GPU (None on CPU, or unknown)."""

    cpu: CpuUse
    gpu_others: list[int] | None


@dataclass
class RankMeasurements:
    """Everything one rank measured, as raw trials: what it sends rank 0 to pool (all_gather_object)."""

    probe: BlockProbe
    batches: list[int]
    blocks: dict[tuple[int, int], BlockMeasurement]  # by (block, batch)
    chain: dict[int, Trials]  # by batch: every block's work one after another (CPU only)
    data: dict[int, Trials]  # by batch
    p2p: dict[tuple[int, int], Trials]  # by (boundary, batch)
    inter: list[tuple[int, float]]  # (bytes, one-way seconds) of sends to another node; rank 0 only
    allreduce: dict[tuple[int, int], Trials]  # by (group size, block)
    replicated: dict[tuple[int, int], Trials]  # by (group size, block)
    param_counts: list[int]
    baseline_bytes: int
    input_bytes_per_sample: int
    load: RankLoad


def timed(fn: Callable[[], Any], trials: int, device: torch.device) -> Trials:
    """`trials` timed calls; taken again while they disagree, keeping the steadiest attempt (measure.steadiest)."""
    samples, remeasured = steadiest(lambda: timed_once(fn, trials, device))
    return Trials(samples, remeasured)


@dataclass
class BlockWork:
    """One block's work on a fixed batch `x`, as the runtime runs it: the teacher's forward, the student's step
    (on a copy of the workload's student, so measuring trains nothing a job uses)."""

    x: torch.Tensor
    teacher: nn.Module
    target: torch.Tensor
    student: StudentBlock
    lr: float
    steps: itertools.count[int] = field(default_factory=itertools.count)

    @classmethod
    def of(cls, workload: Workload, index: int, spec: Spec, x: torch.Tensor, device: torch.device) -> BlockWork:
        teacher = workload.teacher_blocks[index]
        with torch.no_grad():
            target = teacher(x)
        module = copy.deepcopy(workload.student_blocks[index])
        student = StudentBlock(index, module, workload.loss_of(index), spec, workload.search, device)
        return cls(x, teacher, target, student, spec.train.lr)

    def teacher_step(self) -> None:
        with torch.no_grad():
            self.teacher(self.x)

    def student_step(self, round_: str = "weights") -> None:
        self.student.begin(next(self.steps), round_)  # supernets sample a fresh path each trial
        self.student.loss(self.x, self.target).backward()
        self.student.update(round_, self.lr)

    def both(self) -> None:
        self.teacher_step()
        self.student_step()


def measure_block(
    workload: Workload, index: int, spec: Spec, x: torch.Tensor, trials: int, device: torch.device
) -> BlockMeasurement:
    """Teacher forward and student step times of one block on the batch `x`, each timed in a loop of its own."""
    work = BlockWork.of(workload, index, spec, x, device)
    batch, module = len(x), work.student.module
    result = BlockMeasurement(
        teacher=timed(work.teacher_step, trials, device),
        student=timed(work.student_step, trials, device),
        saved_bytes=saved_bytes(module, x),
        output_bytes_per_sample=work.target.numel() * work.target.element_size() // batch,
    )
    if work.student.supernet is not None:
        result.student_arch = timed(functools.partial(work.student_step, "arch"), trials, device)
    if isinstance(module, Candidates) and len(module.options) > 1 and batch == spec.data.batch_size:
        result.candidate_forward, result.layer_forward = measure_candidates(module, work.teacher, x, trials, device)
    if device.type == "cuda":
        result.student_peak_bytes = cuda_peak_bytes(work.student_step, device)
    return result


def measure_chain(
    workload: Workload, spec: Spec, probe: BlockProbe, batch: int, dtype: torch.dtype, trials: int
) -> Trials:
    """Every block's work at `batch` rows run one after another, as a training step runs it (CPU: where the
    blocks evict each other from the caches, what timing each in a loop of its own does not see)."""
    cpu = torch.device("cpu")
    works = [
        BlockWork.of(
            workload,
            index,
            spec,
            block_input(probe.shapes[index], batch, dtype if index == 0 else torch.float32, cpu),
            cpu,
        )
        for index in range(len(workload.teacher_blocks))
    ]

    def one_after_another() -> None:
        for work in works:
            work.both()

    return timed(one_after_another, trials, cpu)


def measure_candidates(
    student: Candidates, teacher: nn.Module, x: torch.Tensor, trials: int, device: torch.device
) -> tuple[list[Trials], Trials]:
    """A search's block: each candidate's forward and the teacher layer's alone, all on the hidden state
    the block's prefix (block 0's embedding) makes of `x`."""
    layer = replaced_layer(teacher)
    with torch.no_grad():
        hidden = student.prepare(x)

    def forward(module: nn.Module) -> Callable[[], Any]:
        def run() -> None:
            with torch.no_grad():
                module(hidden)

        return run

    candidates = [timed(forward(option), trials, device) for option in student.options]
    return candidates, timed(forward(layer), trials, device)


def cuda_peak_bytes(fn: Callable[[], Any], device: torch.device) -> int:
    """The GPU memory `fn` allocates at its peak above what was allocated before it (CUDA only)."""
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize(device)
    return int(torch.cuda.max_memory_allocated(device) - before)


def measure_data(spec: Spec, batch_sizes: list[int], trials: int, device: torch.device) -> dict[int, Trials]:
    dataset = build_dataset(spec)
    result = {}
    for batch in batch_sizes:
        steps = list(range((WARMUP + trials) * (MAX_REMEASURES + 1)))  # batches enough for every attempt
        loader = iter(BatchLoader(spec, dataset, (0, batch), steps, device))
        result[batch] = timed(functools.partial(next, loader), trials, device)
    return result


def send_pairs(shapes: list[list[int]], batch_sizes: list[int]) -> list[tuple[int, int]]:
    """(boundary, batch) of every relay a plan can send: the boundaries between blocks, every shard size."""
    return [(boundary, batch) for boundary in range(1, len(shapes) - 1) for batch in batch_sizes]


def measure_p2p(
    shapes: list[list[int]], batch_sizes: list[int], trials: int, device: torch.device, per_node: int
) -> dict[tuple[int, int], Trials]:
    """One-way time per (boundary, batch): ping-pong between ranks (0,1), (2,3), ... of one node, at once."""
    rank, world = dist.get_rank(), dist.get_world_size()
    peer = rank ^ 1
    result: dict[tuple[int, int], Trials] = {}
    same_node = peer < world and peer // per_node == rank // per_node
    for boundary, batch in send_pairs(shapes, batch_sizes) if same_node else []:
        buffer = torch.zeros((batch, *shapes[boundary]), device=device)
        trip = functools.partial(ping_pong, buffer, peer, rank % 2 == 0)
        result[(boundary, batch)] = Trials(timed_once(trip, trials, device)).scaled(0.5)
    dist.barrier()
    return result


def measure_inter_node(
    shapes: list[list[int]], batch_sizes: list[int], trials: int, device: torch.device, per_node: int
) -> list[tuple[int, float]]:
    """(bytes, one-way seconds) of sends between rank 0 and rank `per_node` (the first rank of another node:
    ranks are numbered node by node), at every relay's size, the other ranks waiting; [] on other ranks."""
    rank = dist.get_rank()
    points: list[tuple[int, float]] = []
    if rank in (0, per_node):
        peer = per_node if rank == 0 else 0
        for boundary, batch in send_pairs(shapes, batch_sizes):
            buffer = torch.zeros((batch, *shapes[boundary]), device=device)
            trip = functools.partial(ping_pong, buffer, peer, rank == 0)
            nbytes = buffer.numel() * buffer.element_size()
            points += [(nbytes, 0.5 * seconds) for seconds in timed_once(trip, trials, device)]
    dist.barrier()
    return points if rank == 0 else []


def measure_all_reduce(param_counts: list[int], trials: int, device: torch.device) -> dict[tuple[int, int], Trials]:
    """Time per (group size k, block): all-reduce of the block's gradients in groups of k ranks at once."""
    rank, world = dist.get_rank(), dist.get_world_size()
    result: dict[tuple[int, int], Trials] = {}
    for size in range(2, world + 1):
        groups = [dist.new_group(list(range(g * size, (g + 1) * size))) for g in range(world // size)]
        mine = groups[rank // size] if rank < len(groups) * size else None
        for block, count in enumerate(param_counts):
            flat = torch.zeros(max(1, count), device=device)
            if isinstance(mine, dist.ProcessGroup):
                all_reduce = functools.partial(dist.all_reduce, flat, group=mine)
                result[(size, block)] = Trials(timed_once(all_reduce, trials, device))
        dist.barrier()
    return result


def measure_replicated(
    workload: Workload, spec: Spec, probe: Any, dtype: torch.dtype, trials: int, device: torch.device
) -> dict[tuple[int, int], Trials]:
    """Time per (group size k, block): the student step at ceil(B/k) rows as training runs it in a stage of k
    replicas (with_sync_batchnorm: its BatchNorm synchronised over the group, one collective per layer in
    the forward and one in the backward), in groups of k ranks at once; without the gradient all-reduce,
    which measure_all_reduce times. Collective, so taken once (no rank may remeasure alone)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    result: dict[tuple[int, int], Trials] = {}
    for size in range(2, world + 1):
        groups = [dist.new_group(list(range(g * size, (g + 1) * size))) for g in range(world // size)]
        mine = groups[rank // size] if rank < len(groups) * size else None
        batch = -(-spec.data.batch_size // size)
        for index, teacher in enumerate(workload.teacher_blocks):
            if not isinstance(mine, dist.ProcessGroup):
                continue
            teacher.to(device)
            x = block_input(probe.shapes[index], batch, dtype if index == 0 else torch.float32, device)
            with torch.no_grad():
                target = teacher(x)
            teacher.cpu()
            module = with_sync_batchnorm(copy.deepcopy(workload.student_blocks[index]), mine, device)
            student = StudentBlock(index, module, workload.loss_of(index), spec, workload.search, device)
            step = functools.partial(replicated_step, student, x, target, itertools.count(), spec.train.lr)
            result[(size, index)] = Trials(timed_once(step, trials, device))
        dist.barrier()
    return result


def replicated_step(
    student: StudentBlock, x: torch.Tensor, target: torch.Tensor, steps: itertools.count[int], lr: float
) -> None:
    student.begin(next(steps), "weights")
    student.loss(x, target).backward()
    student.update("weights", lr)


def device_memory_bytes(device: torch.device, nproc: int) -> int:
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    return int(psutil.virtual_memory().total // nproc)  # ranks on one host share its memory


@dataclass
class CpuWindow:
    """CPU seconds spent while a rank measured: by the whole node (counted on rank 0) and by this rank."""

    started: float
    node_busy_s: float
    own_s: float

    @staticmethod
    def own_seconds() -> float:
        """What counts as "own" CPU time (here: this process's)."""
        return own_cpu_seconds()

    @classmethod
    def open(cls) -> Self:
        return cls(time.monotonic(), node_busy_seconds(), cls.own_seconds())

    def close(self) -> CpuUse:
        return CpuUse(
            wall_s=time.monotonic() - self.started,
            node_busy_s=node_busy_seconds() - self.node_busy_s,
            own_s=self.own_seconds() - self.own_s,
        )


def node_busy_seconds() -> float:
    times = psutil.cpu_times()
    return float(sum(times) - times.idle - getattr(times, "iowait", 0.0))


def own_cpu_seconds() -> float:
    times = psutil.Process().cpu_times()
    return float(times.user + times.system)


def other_gpu_processes(device: torch.device) -> list[int] | None:
    """Pids of other processes computing on this rank's GPU (None on CPU, or without NVML)."""
    if device.type != "cuda":
        return None
    try:
        pynvml = importlib.import_module("pynvml")
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
        running = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    except Exception:
        return None
    return sorted(int(process.pid) for process in running if process.pid != os.getpid())


def measure_rank(spec: Spec, device: torch.device, trials: int) -> RankMeasurements:
    """Everything this rank measures; raw trial lists so rank 0 can pool them."""
    window = CpuWindow.open()
    workload = build_workload(spec)
    sample = build_dataset(spec)[0][0]
    probe = probe_workload(workload, sample)
    batches = profile_batch_sizes(spec.data.batch_size, spec.schedule.world_size)
    per_node, nodes = spec.schedule.nproc, spec.schedule.nodes
    blocks: dict[tuple[int, int], BlockMeasurement] = {}
    for index, teacher in enumerate(workload.teacher_blocks):
        teacher.to(device)
        for batch in batches:
            dtype = sample.dtype if index == 0 else torch.float32
            x = block_input(probe.shapes[index], batch, dtype, device)
            blocks[(index, batch)] = measure_block(workload, index, spec, x, trials, device)
        teacher.cpu()
    distributed = dist.is_initialized() and dist.get_world_size() > 1
    param_counts = [sum(p.numel() for p in s.parameters()) for s in workload.student_blocks]
    chain = (
        {b: measure_chain(workload, spec, probe, b, sample.dtype, trials) for b in batches}
        if device.type == "cpu"
        else {}
    )
    data = measure_data(spec, batches, trials, device)
    p2p = measure_p2p(probe.shapes, batches, trials, device, per_node) if distributed else {}
    inter = measure_inter_node(probe.shapes, batches, trials, device, per_node) if nodes > 1 else []
    allreduce = measure_all_reduce(param_counts, trials, device) if distributed else {}
    replicated = measure_replicated(workload, spec, probe, sample.dtype, trials, device) if distributed else {}
    return RankMeasurements(
        probe=probe,
        batches=batches,
        blocks=blocks,
        chain=chain,
        data=data,
        p2p=p2p,
        inter=inter,
        allreduce=allreduce,
        replicated=replicated,
        param_counts=param_counts,
        baseline_bytes=baseline_memory_bytes(device),
        input_bytes_per_sample=sample.numel() * sample.element_size(),
        load=RankLoad(window.close(), other_gpu_processes(device)),
    )


def baseline_memory_bytes(device: torch.device) -> int:
    """What a rank holds before any block: the process itself on CPU, nothing extra on CUDA."""
    if device.type == "cuda":
        return 0
    return int(psutil.Process().memory_info().rss)


def pooled(found: Iterable[Trials | None]) -> Timing:
    """The trials every rank took of one measurement, pooled (a zero timing where no rank took it)."""
    trials = [trial for trial in found if trial is not None]
    samples = [sample for trial in trials for sample in trial.samples]
    if not samples:
        return Timing(median=0.0)
    return summarise(samples, max(trial.remeasured for trial in trials))


def pool(measurements: list[RankMeasurements], spec: Spec, device: torch.device) -> Profile:
    """Combine every rank's trials into one profile document."""
    first = measurements[0]
    batches = first.batches
    probe = first.probe
    world = spec.schedule.world_size

    def block(index: int, batch: int) -> list[BlockMeasurement]:
        return [m.blocks[(index, batch)] for m in measurements if (index, batch) in m.blocks]

    def by_group(index: int, section: Callable[[RankMeasurements], dict[tuple[int, int], Trials]]) -> dict[int, Timing]:
        return {k: pooled(section(m).get((k, index)) for m in measurements) for k in range(2, world + 1)}

    blocks = [
        BlockProfile(
            teacher_s={b: pooled(found.teacher for found in block(index, b)) for b in batches},
            student_s={b: pooled(found.student for found in block(index, b)) for b in batches},
            student_arch_s={b: pooled(found.student_arch for found in block(index, b)) for b in batches},
            saved_bytes={b: first.blocks[(index, b)].saved_bytes for b in batches},
            student_peak_bytes=peak_bytes(measurements, index, batches),
            teacher_param_bytes=4 * probe.teacher_params[index],
            student_param_bytes=4 * probe.student_params[index],
            allreduce_s=by_group(index, lambda m: m.allreduce),
            student_group_s=by_group(index, lambda m: m.replicated),
            candidate_forward_s=candidate_timings(block(index, batches[0])),
            layer_forward_s=pooled(found.layer_forward for found in block(index, batches[0]))
            if first.blocks[(index, batches[0])].candidate_forward
            else None,
        )
        for index in range(len(probe.teacher_flops))
    ]
    boundaries = range(len(probe.shapes))
    p2p_s = [{b: pooled(m.p2p.get((i, b)) for m in measurements) for b in batches} for i in boundaries]
    boundary_bytes = [
        first.input_bytes_per_sample,
        *(first.blocks[(index, batches[0])].output_bytes_per_sample for index in range(len(blocks))),
    ]
    return Profile(
        nproc=world,
        nodes=spec.schedule.nodes,
        batch_size=spec.data.batch_size,
        batch_sizes=batches,
        device=device_name(device),
        device_memory_bytes=device_memory_bytes(device, spec.schedule.nproc),  # ranks of one node share it
        baseline_bytes=max(m.baseline_bytes for m in measurements),
        shapes=probe.shapes,
        boundary_bytes_per_sample=boundary_bytes,
        blocks=blocks,
        data_s={b: pooled(m.data.get(b) for m in measurements) for b in batches},
        chain_s={b: pooled(m.chain.get(b) for m in measurements) for b in batches} if first.chain else {},
        p2p_s=p2p_s,
        links=links(p2p_s, boundary_bytes, first.inter),
        measured_at=time.time(),
        conditions=conditions([m.load for m in measurements]),
    )


def candidate_timings(found: list[BlockMeasurement]) -> list[Timing]:
    """A search's block: each candidate's pooled forward time, as the first rank counts them (none otherwise)."""
    count = len(found[0].candidate_forward) if found else 0
    return [
        pooled(m.candidate_forward[c] if c < len(m.candidate_forward) else None for m in found) for c in range(count)
    ]


def links(
    p2p_s: list[dict[int, Timing]], boundary_bytes: list[int], inter: list[tuple[int, float]]
) -> dict[str, LinkFit]:
    """The node's link fitted to its measured relays (median per size), and the link between nodes to its
    sends; a link with too few sizes to fit is left out."""
    intra = [
        (batch * boundary_bytes[boundary], timing.median)
        for boundary, table in enumerate(p2p_s)
        for batch, timing in table.items()
        if timing.trials
    ]
    fits = {"intra": fit_link(intra), "inter": fit_link(inter)}
    return {name: fit for name, fit in fits.items() if fit is not None}


def conditions(loads: list[RankLoad]) -> Conditions:
    """Under what load the profile was taken: other processes' CPU use on the node (in cores, while the
    ranks measured), the node's load average, and other processes on each rank's GPU."""
    wall = max(load.cpu.wall_s for load in loads)
    others = loads[0].cpu.node_busy_s - sum(load.cpu.own_s for load in loads)
    gpu = [load.gpu_others for load in loads]
    return Conditions(
        cpus=psutil.cpu_count() or 1,
        other_cpu_cores=max(0.0, others) / wall if wall > 0 else 0.0,
        load_average_1m=os.getloadavg()[0],
        gpu_other_processes=None if any(pids is None for pids in gpu) else gpu,
        noisy_spread=NOISY_SPREAD,
    )


def peak_bytes(measurements: list[RankMeasurements], index: int, batches: list[int]) -> dict[int, int] | None:
    """`student_peak_bytes` per batch (the largest any rank saw), where the ranks measured it (CUDA)."""
    found = {b: [m.blocks[(index, b)].student_peak_bytes for m in measurements] for b in batches}
    peaks = {b: [value for value in values if value is not None] for b, values in found.items()}
    if any(len(peaks[b]) < len(found[b]) for b in batches):
        return None
    return {b: max(values) for b, values in peaks.items()}


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(device)}"
    return "cpu"


def profile_ranks(run_dir: RunDir, trials: int) -> None:
    """Measure on this rank, gather on rank 0, and let rank 0 write profile.json."""
    spec = run_dir.load_spec()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    device = pick_device(spec, int(os.environ.get("LOCAL_RANK", "0")))
    join_process_group(spec, device, world)
    measured = measure_rank(spec, device, trials)
    gathered = gather_on_rank_zero(measured)
    if gathered is not None:
        run_dir.write_json(run_dir.profile, pool(gathered, spec, device).to_json())


@record
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m pipebd_core.profile.blocks", description="one profiling rank")
    parser.add_argument("--trials", type=int, default=5, help="timed trials per measurement, after warm-up")
    phase_entry(PROFILE, parser, lambda run_dir, args: profile_ranks(run_dir, args.trials), argv)


if __name__ == "__main__":
    main()
    exit_now()
