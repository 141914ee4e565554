"""Processes of a job: the torchrun command line, the ranks' environment, and stopping a whole tree.

Shared by the launcher (training and profiling jobs) and the service's workers.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from dataclasses import dataclass

import psutil

from pipebd_core.job.forked import PhaseProcess
from pipebd_core.rundir import RunDir
from pipebd_core.spec import Spec

# What ranks may inherit from the launcher's PIPEBD_ variables; the rest (service secrets, database
# and broker URLs) stays out of the job's processes.
RANK_VISIBLE = ("PIPEBD_CACHE_DIR", "PIPEBD_INJECT_FAULT")
# glibc's malloc, left to itself, gives the big buffers of a step's activations and gradients back to the
# kernel as they are freed (each over its mmap threshold, or trimmed off the heap's top) and takes fresh,
# zeroed pages for the next step's. Ranks keep what they freed instead: buffers up to 32 MiB (glibc's
# largest threshold) come from the heap, and the heap is never trimmed below 4 GiB. Measured on the
# LayerPipe sample network, 2 CPU ranks, three runs each: ddp 209-215 ms a step without, 172-188 ms with;
# gpipe 316-340 ms without, 283-296 ms with. A launcher's own setting of either variable is kept. A phase
# process forked warm sets them with mallopt, which takes an int: the trim threshold is 2 GiB there (job/forked.py).
RANK_ALLOCATOR = {"MALLOC_MMAP_THRESHOLD_": str(32 * 2**20), "MALLOC_TRIM_THRESHOLD_": str(4 * 2**30)}


def inherited_environment() -> dict[str, str]:
    """What a job's processes inherit of the launcher's environment: all of it less service secrets."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PIPEBD_") or k in RANK_VISIBLE}


def rank_environment(spec: Spec, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a job's processes: the launcher's, less service secrets, plus `extra`."""
    env = {**RANK_ALLOCATOR, **inherited_environment(), **(extra or {})}
    threads = str(spec.schedule.threads_per_rank)
    env.update({"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "PYTHONUNBUFFERED": "1"})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH", "")]))
    return env


@dataclass(frozen=True)
class Rendezvous:
    """Where the torchrun agents of one launch on several nodes meet (torchrun's c10d rendezvous): node 0's
    agent hosts the store at `endpoint`; the others connect to it. torchrun numbers the ranks in the order
    the agents join (it ignores a node rank under c10d), so nothing may assume which node runs rank r."""

    nnodes: int
    node: int  # 0: this node's agent hosts the rendezvous store
    endpoint: str  # HOST:PORT of node 0, reachable from every node
    run_id: str  # the same on every node of the launch
    join_timeout_s: int = 60  # the agents wait this long for each other, then fail
    local_addr: str | None = None  # the address the other nodes reach this one at (None: torchrun's guess)

    def arguments(self) -> list[str]:
        conf = f"is_host={int(self.node == 0)},join_timeout={self.join_timeout_s}"
        arguments = ["--nnodes", str(self.nnodes), "--rdzv-backend", "c10d", "--rdzv-endpoint", self.endpoint]
        arguments += ["--rdzv-id", self.run_id, "--rdzv-conf", conf]
        return arguments + (["--local-addr", self.local_addr] if self.local_addr else [])


def torchrun_command(
    nproc: int,
    run_dir: RunDir,
    module: str = "pipebd_core.distill",
    *args: str,
    rendezvous: Rendezvous | None = None,
) -> list[str]:
    """torchrun running `module` on every rank: `--standalone` (torchrun picks a free port) on one node, or
    this node's part of a launch on several (`rendezvous`); its ranks forked from the agent
    (warm_torchrun.py) rather than each importing torch again."""
    torchrun = [sys.executable, "-m", "pipebd_core.job.warm_torchrun", "--nproc-per-node", str(nproc)]
    torchrun += ["--standalone"] if rendezvous is None else rendezvous.arguments()
    return [*torchrun, "--max-restarts", "0", "-m", module, "--run-dir", str(run_dir.root.resolve()), *args]


def _session_processes(session: int) -> list[psutil.Process]:
    """Every process of a session: the agent started with start_new_session leads its own."""
    members = []
    for candidate in psutil.process_iter():
        with contextlib.suppress(psutil.Error, ProcessLookupError, PermissionError):
            if os.getsid(candidate.pid) == session:
                members.append(candidate)
    return members


def _signal_group(group: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signum)


def stop_process_tree(process: PhaseProcess, grace_s: float = 10.0) -> list[int]:
    """SIGTERM the job's whole session (torchrun agent and ranks), then SIGKILL whatever is left after
    `grace_s`, descendants that left the session included. Returns the pids that had to be killed."""
    try:
        descendants = psutil.Process(process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        descendants = []
    tree = {p.pid: p for p in [*descendants, *_session_processes(process.pid)]}
    _signal_group(process.pid, signal.SIGTERM)
    _, alive = psutil.wait_procs(list(tree.values()), timeout=grace_s)
    _signal_group(process.pid, signal.SIGKILL)
    survivors = {p.pid: p for p in [*alive, *_session_processes(process.pid)]}
    for survivor in survivors.values():
        with contextlib.suppress(psutil.NoSuchProcess):
            survivor.kill()
    psutil.wait_procs(list(survivors.values()), timeout=5)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=5)
    return list(survivors)
