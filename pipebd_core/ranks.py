"""Rank-side set-up shared by training and profiling ranks: device, process group, logs, errors."""

from __future__ import annotations

import datetime
import os
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

from pipebd_core.processes import RANK_LOGS_ENV
from pipebd_core.rundir import RunDir
from pipebd_core.spec import Spec
from pipebd_core.telemetry import append_event


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


def join_process_group(spec: Spec, device: torch.device, world: int) -> None:
    if world == 1:
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    timeout = datetime.timedelta(seconds=spec.schedule.timeout_s)
    dist.init_process_group(backend=backend, timeout=timeout, device_id=device if backend == "nccl" else None)


def redirect_output_to_log() -> None:
    """Send this rank's stdout and stderr to logs/rank-<r>.log when the launcher asks for it."""
    folder = os.environ.get(RANK_LOGS_ENV)
    if not folder:
        return
    Path(folder).mkdir(parents=True, exist_ok=True)
    log = os.open(Path(folder) / f"rank-{os.environ.get('RANK', '0')}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)


def write_rank_error(run_dir: RunDir, error: BaseException) -> None:
    rank = int(os.environ.get("RANK", "0"))
    record_ = {
        "rank": rank,
        "time": time.time(),
        "type": type(error).__name__,
        "message": str(error),
        "traceback": "".join(traceback.format_exception(error)),
    }
    run_dir.write_json(run_dir.error(rank), record_)
    append_event(run_dir.events, "rank_error", rank=rank, type=record_["type"], message=record_["message"])
