"""Processes of a job: the torchrun command line, the ranks' environment, and stopping a whole tree.

Shared by the launcher (training and profiling jobs) and the service's workers.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from typing import Any

import psutil

from pipebd_core.rundir import RunDir
from pipebd_core.spec import Spec

RANK_LOGS_ENV = "PIPEBD_RANK_LOG_DIR"  # ranks send their stdout/stderr to files here


def rank_environment(spec: Spec, run_dir: RunDir, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {**os.environ, **(extra or {})}
    threads = str(spec.schedule.threads_per_rank)
    env.update({"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "PYTHONUNBUFFERED": "1"})
    env[RANK_LOGS_ENV] = str((run_dir.root / "logs").resolve())
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH", "")]))
    return env


def torchrun_command(nproc: int, run_dir: RunDir, module: str = "pipebd_core", *args: str) -> list[str]:
    """`torchrun --standalone` (torchrun picks a free port) running `module` on every rank."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]
    return [*torchrun, "--max-restarts", "0", "-m", module, "--run-dir", str(run_dir.root.resolve()), *args]


def stop_process_tree(process: subprocess.Popen[Any], grace_s: float = 10.0) -> list[int]:
    """SIGTERM the torchrun agent, then SIGKILL every descendant still alive after `grace_s`.

    Returns the pids that had to be killed. No rank process survives this call.
    """
    try:
        tree = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
    _, alive = psutil.wait_procs(tree, timeout=grace_s)
    for survivor in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            survivor.kill()
    psutil.wait_procs(alive, timeout=5)
    process.wait(timeout=5)
    return [survivor.pid for survivor in alive]
