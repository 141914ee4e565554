"""Rank entry point: `torchrun --standalone --nproc-per-node N -m pipebd_core --run-dir DIR`.

Reads the spec and plan the launcher wrote, joins the process group (NCCL on GPUs, gloo on CPU),
trains this rank's tasks, and on rank 0 writes the final artifacts. A rank that raises writes its
traceback to errors/rank-<r>.json before exiting, so the launcher can show the root cause.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from pipebd_core import checkpoint
from pipebd_core.data import Stream, build_dataset
from pipebd_core.finalize import finalize
from pipebd_core.plan import Plan
from pipebd_core.ranks import join_process_group, pick_device, redirect_output_to_log, write_rank_error
from pipebd_core.rundir import RunDir
from pipebd_core.runtime import RankContext, Trainer
from pipebd_core.schedule import rank_tasks
from pipebd_core.spec import parse_spec
from pipebd_core.telemetry import append_event
from pipebd_core.workloads import build_workload


def build_context(run_dir: RunDir, rank: int, device: torch.device) -> RankContext:
    spec = parse_spec(run_dir.read_json(run_dir.spec))
    plan = Plan.from_json(run_dir.read_json(run_dir.plan))
    workload = build_workload(spec)
    total_steps = plan.details["total_steps"]
    start_steps = checkpoint.resume_steps(run_dir.checkpoints, plan.num_blocks, common=plan.is_pipeline)
    loads_data = any(task.loads_data for task in rank_tasks(plan, rank, total_steps, start_steps))
    return RankContext(
        rank=rank,
        spec=spec,
        plan=plan,
        run_dir=run_dir,
        workload=workload,
        dataset=build_dataset(spec) if loads_data else None,
        device=device,
        steps_per_epoch=plan.details["steps_per_epoch"],
        total_steps=total_steps,
        start_steps=start_steps,
        streams={round_: Stream(**fields) if fields else None for round_, fields in plan.details["streams"].items()},
    )


def run_rank(run_dir: RunDir) -> None:
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    spec = parse_spec(run_dir.read_json(run_dir.spec))
    device = pick_device(spec, int(os.environ.get("LOCAL_RANK", "0")))
    join_process_group(spec, device, world)
    ctx = build_context(run_dir, rank, device)
    append_event(run_dir.events, "rank_started", rank=rank, device=str(device), start_steps=ctx.start_steps)
    Trainer(ctx).run()
    append_event(run_dir.events, "rank_finished", rank=rank)
    if rank == 0:
        summary = finalize(run_dir, ctx.spec, ctx.workload, ctx.total_steps, device)
        append_event(run_dir.events, "artifacts_written", final_loss=summary["final_loss"])
    if dist.is_initialized():
        dist.destroy_process_group()


@record
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m pipebd_core", description="one PipeBD rank (run by torchrun)")
    parser.add_argument("--run-dir", required=True, help="run directory prepared by `pipebd run`")
    args = parser.parse_args(argv)
    run_dir = RunDir(Path(args.run_dir))
    redirect_output_to_log()
    try:
        run_rank(run_dir)
    except Exception as error:
        write_rank_error(run_dir, error)
        raise


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # everything is written and closed; skip seconds of interpreter teardown
