"""Prepare a run directory and launch the ranks with torchrun.

`prepare_run` does every check that can fail before a process starts (spec, data set, plan), so a
bad job never leaves half a run behind it. `start_ranks` starts `torchrun --standalone` (a free port
is picked by torchrun) in a session of its own, so the whole process tree can be signalled at once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil

from pipebd_core.data import build_dataset, check_dataset, steps_per_epoch, total_steps
from pipebd_core.plan import Plan, make_plan
from pipebd_core.probe import probe_workload
from pipebd_core.rundir import RunDir
from pipebd_core.spec import Spec, SpecError
from pipebd_core.telemetry import append_event
from pipebd_core.workloads import build_workload

RANK_LOGS_ENV = "PIPEBD_RANK_LOG_DIR"  # ranks send their stdout/stderr to files here


def default_run_dir(spec: Spec, base: Path = Path("runs")) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return base / f"{spec.name}-{stamp}"


def resolve_plan(spec: Spec) -> Plan:
    """Build the workload once (on CPU), probe it and resolve the schedule into a plan."""
    num_samples = check_dataset(spec)
    per_epoch = steps_per_epoch(spec, num_samples)
    steps = total_steps(spec, num_samples)
    workload = build_workload(spec)
    sample = build_dataset(spec)[0][0]
    probe = probe_workload(workload, tuple(sample.shape))
    plan = make_plan(
        spec.schedule, workload.num_blocks, spec.data.batch_size, probe.stage_costs(), probe.prefix_costs()
    )
    plan.details.update(
        {
            "block_names": workload.block_names,
            "shapes": probe.shapes,
            "num_samples": num_samples,
            "steps_per_epoch": per_epoch,
            "total_steps": steps,
            "estimates": probe.to_json(),
            "warnings": workload.warnings,
        }
    )
    return plan


def prepare_run(spec: Spec, out: Path | None = None) -> RunDir:
    """Validate everything, then create the run directory with spec.json and plan.json."""
    plan = resolve_plan(spec)
    root = out if out is not None else default_run_dir(spec)
    if (root / "spec.json").exists():
        raise SpecError(f"--out {root}: a run already lives there; use --resume {root} or another folder")
    run_dir = RunDir(root)
    root.mkdir(parents=True, exist_ok=True)
    run_dir.write_json(run_dir.spec, spec.model_dump(mode="json"))
    run_dir.write_json(run_dir.plan, plan.to_json())
    append_event(run_dir.events, "prepared", mode=plan.mode, nproc=plan.nproc)
    return run_dir


def rank_environment(spec: Spec, run_dir: RunDir, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {**os.environ, **(extra or {})}
    threads = str(spec.schedule.threads_per_rank)
    env.update({"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "PYTHONUNBUFFERED": "1"})
    env[RANK_LOGS_ENV] = str((run_dir.root / "logs").resolve())
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH", "")]))
    return env


def torchrun_command(nproc: int, run_dir: RunDir) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        "--max-restarts",
        "0",
        "-m",
        "pipebd_core",
        "--run-dir",
        str(run_dir.root.resolve()),
    ]


def start_ranks(spec: Spec, run_dir: RunDir, extra_env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start torchrun in its own session; its output goes to logs/launcher.log."""
    log_path = run_dir.root / "logs" / "launcher.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            torchrun_command(spec.schedule.nproc, run_dir),
            env=rank_environment(spec, run_dir, extra_env),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    append_event(run_dir.events, "launched", pid=process.pid, nproc=spec.schedule.nproc)
    return process


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


def wait_for(process: subprocess.Popen[Any], poll_s: float = 0.5) -> int:
    while process.poll() is None:
        time.sleep(poll_s)
    return int(process.returncode)
