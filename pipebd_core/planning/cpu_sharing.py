"""Ranks sharing a CPU node's cores: what a profile's seconds measured, and what a run will see.

A profiler times every measurement with every rank of the node measuring at once, each with its threads,
beside whatever else the node ran (the profile's conditions: the other processes' cores). On a CPU node
with C cores, n runnable threads share them: each gets at most min(1, C / n) of a core, so a second
profiled while R ranks of t threads and o cores of other work ran is the work alone times
max(1, (R t + o) / C), o counting the other cores beyond the 0.15 that a quiet node shows anyway (the
job's own launcher and the kernel's share of its sends, there in a run too: QUIET_CORES). A run that
has k ranks computing at once (and, as planned, nothing else) sees max(1, k t / C). The cost models
divide the first out of every profiled second and multiply the second in: a 2-rank profile taken while
another process used a core (1.4 x its work alone) no longer predicts a 2-rank pipeline 40% slow, and a
3-rank profile on 2 cores no longer predicts a pipeline whose ranks mostly wait as if all three always
shared two cores. On GPUs (device other than cpu) no sharing is
counted; a profile without its conditions or core count is taken as measured alone.

A measured co-run curve (finetune's layer profile) below this bound is not believed: k single-threaded
ranks on C < k cores cannot each run faster than C / k of their speed alone (a median of short trials
can miss the preemption that makes up the slowdown).
"""

from __future__ import annotations

from pipebd_core.documents.bench_record import SHARED_CORES

QUIET_CORES = SHARED_CORES  # other cores a quiet node shows anyway (the job's launcher, the kernel's share
# of its sends): present in a run as in its profile, so not divided out


def shared_slowdown(threads: float, cpus: int | None) -> float:
    """How much slower each of `threads` runnable threads computes on `cpus` cores than one alone."""
    if not cpus or cpus <= 0:
        return 1.0
    return max(1.0, threads / cpus)


def profiled_share(ranks_per_node: int, threads_per_rank: int, cpus: int | None, other_cores: float) -> float:
    """The slowdown a profile's seconds carry: every rank of the node and the other processes at once
    (those beyond what a quiet node shows)."""
    return shared_slowdown(ranks_per_node * threads_per_rank + max(0.0, other_cores - QUIET_CORES), cpus)
