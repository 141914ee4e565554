"""The process side of every phase: device, process group, logs, errors, and the entry point's frame."""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import importlib
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from pipebd_core.documents.errors import RankError
from pipebd_core.rundir import RunDir
from pipebd_core.spec import Spec
from pipebd_core.workloads.builders import warm_modules

JOIN_STACKS_S = 60.0  # a rank still joining its process group after this long logs where it waits


def preload(run_dir: RunDir) -> list[str]:
    """Import `warm_modules` of this run's spec, so that a warm agent's ranks fork with them imported instead
    of each importing them again. Returns the modules imported. One that fails is left for the ranks to
    import and report, where their errors are written."""
    loaded = []
    for module in warm_modules(run_dir.load_spec()):
        try:
            importlib.import_module(module)
        except Exception:  # the rank that imports it again reports it
            continue
        loaded.append(module)
    return loaded


def pick_device(spec: Spec, local_rank: int) -> torch.device:
    wanted = spec.schedule.device
    if wanted == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("schedule.device is 'cuda' but CUDA is not available here; use 'auto' or 'cpu'")
    if wanted != "cpu" and torch.cuda.is_available():
        if local_rank >= torch.cuda.device_count():
            raise RuntimeError(f"rank {local_rank} needs GPU {local_rank} but only {torch.cuda.device_count()} exist")
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    torch.set_num_threads(spec.schedule.threads_per_rank)
    return torch.device("cpu")


def join_process_group(spec: Spec, device: torch.device, world: int, alone_too: bool = False) -> None:
    """Join the job's process group; a single rank only when `alone_too` (a pipeline schedule needs one).
    A rank still joining after JOIN_STACKS_S writes every thread's stack to its log (stderr), once, and
    goes on waiting: a rank that never joins (seen, rarely, under a full test suite's load) leaves where it
    waited instead of an empty log."""
    if world == 1 and not alone_too:
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    timeout = datetime.timedelta(seconds=spec.schedule.timeout_s)
    faulthandler.dump_traceback_later(JOIN_STACKS_S, repeat=False, file=sys.stderr)
    try:
        dist.init_process_group(backend=backend, timeout=timeout, device_id=device if backend == "nccl" else None)
    finally:
        faulthandler.cancel_dump_traceback_later()


def gather_on_rank_zero(measured: Any) -> list[Any] | None:
    """Every rank's `measured`, in rank order, on rank 0 (None on the others); then leave the group."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    gathered: list[Any] = [measured] * world
    if world > 1:
        dist.all_gather_object(gathered, measured)
    if dist.is_initialized():
        dist.destroy_process_group()
    return gathered if int(os.environ.get("RANK", "0")) == 0 else None


def redirect_output_to_log(run_dir: RunDir, phase: str) -> None:
    """Send this rank's stdout and stderr to the run directory's log of this rank in `phase`."""
    path = run_dir.log(int(os.environ.get("RANK", "0")), phase)
    path.parent.mkdir(parents=True, exist_ok=True)
    log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)


def write_rank_error(run_dir: RunDir, error: BaseException, phase: str) -> None:
    report = RankError(
        rank=int(os.environ.get("RANK", "0")),
        time=time.time(),
        type=type(error).__name__,
        message=str(error),
        traceback="".join(traceback.format_exception(error)),
    )
    run_dir.write_rank_error(phase, report)
    run_dir.append_event("rank_error", phase=phase, rank=report.rank, type=report.type, message=report.message)


def phase_entry(
    phase: str,
    parser: argparse.ArgumentParser,
    body: Callable[[RunDir, argparse.Namespace], object],
    argv: list[str] | None = None,
    own_log: bool = True,
) -> None:
    """A phase process's `main`: parse `--run-dir` (and the parser's own options), send this process's
    output to its log in the run directory (`own_log`; a single-process phase writes to the launcher
    log the supervisor gave it), run `body`, and on an exception leave its traceback in errors/<phase>/."""
    parser.add_argument("--run-dir", required=True, help="the run directory the supervisor prepared")
    args = parser.parse_args(argv)
    run_dir = RunDir(Path(args.run_dir))
    if own_log:
        redirect_output_to_log(run_dir, phase)
    try:
        body(run_dir, args)
    except Exception as error:
        write_rank_error(run_dir, error, phase)
        raise


def exit_now() -> NoReturn:
    """Leave a phase process that succeeded at once: everything it wrote is written and closed, and
    tearing down an interpreter that holds torch (and a rendezvous store) takes most of a second that the
    next phase would wait for."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
