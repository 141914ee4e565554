"""What only a GPU can show, checked in one short run and printed as one table (see scripts/gpu_check.sh).

    python scripts/gpu_check.py OUT_DIR

Rows: a 1-rank CUDA job of each bundled example (profiled on the GPU: CUDA-event phase times, the
profiler's CUDA peak memory, NVML utilisation in the telemetry), and SyncBatchNorm on a CUDA student.
Exit code 0 when every row passed, 1 otherwise, 2 when there is no GPU to check.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLE_STEPS = 3  # optimiser steps per block: enough for telemetry lines, seconds on one GPU
EXAMPLE_TIMEOUT_S = 240


@dataclass
class Row:
    check: str
    passed: bool
    detail: str
    seconds: float


def run_example(spec: Path, out: Path) -> tuple[bool, str]:
    """A 1-rank CUDA run of `spec`, profiled, then what only CUDA ranks write: checked from the files."""
    run = out / spec.stem
    overrides = [
        "schedule.device=cuda",
        "schedule.nproc=1",
        "schedule.mode=tr_dpu",
        "schedule.stages=null",
        "schedule.profile=true",
        f"train.max_steps={EXAMPLE_STEPS}",
    ]
    command = [sys.executable, "-m", "pipebd_core.cli", "run", str(spec), "--out", str(run)]
    command += [arg for override in overrides for arg in ("--set", override)]
    env = {**os.environ, "PIPEBD_CACHE_DIR": str(out / "cache")}
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=EXAMPLE_TIMEOUT_S)
    (run / "compressed_model.pt").unlink(missing_ok=True)  # hundreds of MB nobody reads here
    if result.returncode != 0:
        return False, f"exit {result.returncode}: {result.stderr.strip().splitlines()[-1:]}"
    from pipebd_core.documents.telemetry import DistillLine
    from pipebd_core.rundir import RunDir

    lines = [line for line in RunDir(run).read_telemetry(0) if isinstance(line, DistillLine)]
    profile = json.loads((run / "profile.json").read_text())
    problems = []
    if not profile["device"].startswith("cuda:"):
        problems.append(f"profiled on {profile['device']}")
    if "student_peak_bytes" not in profile["blocks"][0]:
        problems.append("the profile has no CUDA peak memory")
    if not all(line.gpu_util is not None for line in lines):
        problems.append("telemetry lines without NVML gpu_util")
    if not all(sum(line.phases.values()) > 0 for line in lines):
        problems.append("CUDA-event phase times are zero")
    peak = max(line.peak_mem for line in lines)
    utilisation = max(-1 if line.gpu_util is None else line.gpu_util for line in lines)
    detail = f"{len(lines)} lines, peak {peak / 2**20:.0f} MiB, max gpu_util {utilisation}%, {profile['device']}"
    return not problems, "; ".join(problems) or detail


def sync_batchnorm() -> tuple[bool, str]:
    """SyncBatchNorm, as the runtime converts a replicated CUDA student, against BatchNorm2d (NCCL, 1 rank)."""
    import torch
    import torch.distributed as dist
    from torch import nn

    from pipebd_core.rank.batchnorm import with_sync_batchnorm

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    device = torch.device("cuda", 0)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=device)
    try:
        plain = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU()).to(device)
        converted = with_sync_batchnorm(
            nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU()), dist.group.WORLD, device
        )
        converted.load_state_dict(plain.state_dict())
        kinds = sorted({type(m).__name__ for m in converted.modules() if "Norm" in type(m).__name__})
        x = torch.randn(16, 3, 8, 8, device=device) * 3 + 5
        outputs = []
        for module in (plain, converted):
            y = module(x.clone().requires_grad_(True))
            y.square().mean().backward()
            outputs.append((y.detach(), module[0].weight.grad.detach(), module[1].running_var.detach()))
        difference = max(float((a - b).abs().max()) for a, b in zip(*outputs, strict=True))
    finally:
        dist.destroy_process_group()
    return difference < 1e-4, f"{'/'.join(kinds)}: max difference to BatchNorm2d {difference:.2e}"


def timed(name: str, check: Callable[[], tuple[bool, str]]) -> Row:
    started = time.monotonic()
    try:
        passed, detail = check()
    except Exception as error:  # a check that crashes is a failed row, and the others still run
        passed, detail = False, f"{type(error).__name__}: {error}"
    return Row(name, passed, detail, time.monotonic() - started)


def main(out: Path) -> int:
    import torch

    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device is visible; run this on a machine with a GPU", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    print(f"gpu_check: {torch.cuda.get_device_name(0)}, torch {torch.__version__}", flush=True)
    rows = [
        timed(f"example {spec.stem}", lambda spec=spec: run_example(spec, out))
        for spec in sorted((REPO / "examples").glob("*.yaml"))
    ]
    rows.append(timed("SyncBatchNorm on CUDA", sync_batchnorm))
    width = max(len(row.check) for row in rows)
    print(f"| {'check':{width}} | result | seconds | detail |")
    print(f"|{'-' * (width + 2)}|--------|---------|--------|")
    for row in rows:
        print(f"| {row.check:{width}} | {'pass' if row.passed else 'FAIL':6} | {row.seconds:7.1f} | {row.detail} |")
    (out / "gpu_check.json").write_text(json.dumps([row.__dict__ for row in rows], indent=1))
    return 0 if all(row.passed for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "runs/gpu-check")))
