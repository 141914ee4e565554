"""Prepare a run directory and launch the ranks with torchrun.

`prepare_run` does every check that can fail before a process starts (spec, data set, plan), so a
bad job never leaves half a run behind it. `start_ranks` starts `torchrun --standalone` (a free port
is picked by torchrun) in a session of its own, so the whole process tree can be signalled at once.
"""

from __future__ import annotations

import math
import subprocess
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import torch

from pipebd_core.data import Stream, build_dataset, check_dataset, split_streams, steps_per_epoch, total_steps
from pipebd_core.plan import Plan
from pipebd_core.planning.costmodel import CostModel
from pipebd_core.planning.probe import probe_workload
from pipebd_core.planning.profiles import cache_path, obtain_profile
from pipebd_core.planning.resolve import make_plan, predictions
from pipebd_core.processes import rank_environment, torchrun_command
from pipebd_core.rundir import RunDir
from pipebd_core.spec import Spec, SpecError
from pipebd_core.telemetry import append_event
from pipebd_core.workloads import build_workload, search_settings


def default_run_dir(spec: Spec, base: Path = Path("runs")) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return base / f"{spec.name}-{stamp}"


@dataclass(frozen=True)
class Steps:
    """How a spec's data turns into optimiser steps: streams, counts, and when architecture updates happen."""

    train: Stream
    arch: Stream | None
    per_epoch: int
    total: int
    search: dict[str, int] | None

    @classmethod
    def of(cls, spec: Spec) -> Steps:
        settings = search_settings(spec)
        train, arch = split_streams(spec, check_dataset(spec), settings.holdout if settings else None)
        total = total_steps(spec, train.count)
        search = None
        if settings is not None:
            search = {"from_step": math.ceil(settings.warmup * total), "every": settings.update_every}
        return cls(train, arch, steps_per_epoch(spec, train.count), total, search)


def cost_model(spec: Spec, steps: Steps) -> tuple[CostModel, dict[str, Any]]:
    """The cost model from the (cached or measured) profile, and where the profile came from."""
    profile, cached = obtain_profile(spec)
    origin = {"cached": cached, "device": profile["device"], "key": str(cache_path(spec))}
    return CostModel(profile, steps.search["every"] if steps.search else None), origin


def resolve_plan(spec: Spec) -> Plan:
    """Check the data, build and probe the workload once (on CPU), profile if asked, resolve the plan."""
    steps = Steps.of(spec)
    workload = build_workload(spec)
    sample = build_dataset(spec)[0][0]
    probe = probe_workload(workload, tuple(sample.shape))
    model, origin = cost_model(spec, steps) if spec.schedule.profile else (None, None)
    plan = make_plan(spec.schedule, workload.num_blocks, spec.data.batch_size, probe, model)
    plan.details.update(
        {
            "block_names": workload.block_names,
            "shapes": probe.shapes,
            "num_samples": steps.train.count,
            "steps_per_epoch": steps.per_epoch,
            "total_steps": steps.total,
            "streams": {"weights": asdict(steps.train), "arch": asdict(steps.arch) if steps.arch else None},
            "search": steps.search,
            "estimates": probe.to_json(),
            "warnings": workload.warnings,
        }
    )
    if model is not None:
        plan.details["profile"] = origin
        plan.details.update(predictions(plan, model))
    return plan


def check_devices(spec: Spec) -> None:
    """The devices this node has for the ranks, checked before any process starts."""
    schedule = spec.schedule
    if schedule.device == "cpu":
        return
    if not torch.cuda.is_available():
        if schedule.device == "cuda":
            raise SpecError("schedule.device: 'cuda' but CUDA is not available on this machine; use 'auto' or 'cpu'")
        return
    gpus = torch.cuda.device_count()
    if schedule.nproc > gpus:
        raise SpecError(
            f"schedule.nproc: {schedule.nproc} ranks need one GPU each but this machine has {gpus};"
            f" use --nproc {gpus} or fewer, or schedule.device: cpu"
        )


def prepare_run(spec: Spec, out: Path | None = None) -> RunDir:
    """Validate everything, then create the run directory with spec.json and plan.json."""
    check_devices(spec)
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
