"""Rank entry point of the `distill` phase:
`torchrun --standalone --nproc-per-node N -m pipebd_core.distill --run-dir DIR`.

Reads the spec and plan of the run directory, joins the process group (NCCL on GPUs, gloo on CPU)
and trains this rank's tasks; the `finalize` phase gathers the results afterwards. A rank that raises
writes its traceback to errors/distill/rank-<r>.json before exiting, so the supervisor can show the
root cause.
"""

from __future__ import annotations

import argparse
import os
import socket

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from pipebd_core.data.datasets import build_dataset
from pipebd_core.distill.plan import Plan, describe_rank
from pipebd_core.distill.runtime import RankContext, Trainer
from pipebd_core.distill.schedule import rank_tasks
from pipebd_core.documents.phases import DISTILL
from pipebd_core.rank.process import exit_now, join_process_group, phase_entry, pick_device
from pipebd_core.rundir import RunDir
from pipebd_core.workloads.workload import build_workload


def build_context(run_dir: RunDir, rank: int, device: torch.device) -> RankContext:
    spec = run_dir.load_spec()
    plan = Plan.from_document(run_dir.load_plan())
    workload = build_workload(spec)
    steps = plan.step_plan
    start_steps = run_dir.checkpoints.resume_steps(plan.num_blocks, common=plan.is_pipeline)
    loads_data = any(task.loads_data for task in rank_tasks(plan, rank, steps.total, start_steps, steps.search))
    return RankContext(
        rank=rank,
        spec=spec,
        plan=plan,
        run_dir=run_dir,
        workload=workload,
        dataset=build_dataset(spec) if loads_data else None,
        device=device,
        steps=steps,
        start_steps=start_steps,
    )


def run_rank(run_dir: RunDir) -> None:
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    spec = run_dir.load_spec()
    device = pick_device(spec, int(os.environ.get("LOCAL_RANK", "0")))
    join_process_group(spec, device, world)
    ctx = build_context(run_dir, rank, device)
    role = describe_rank(ctx.plan, rank)
    print(f"pipebd: rank {rank} of {world} on {device}: blocks {role['blocks']}, rows {role['rows']}", flush=True)
    node = int(os.environ.get("GROUP_RANK", "0"))  # torchrun's number of this node's agent
    where = {"node": node, "host": socket.gethostname()}
    run_dir.append_event("rank_started", rank=rank, device=str(device), start_steps=ctx.start_steps, **where)
    stopped = Trainer(ctx).run()  # a rank that stopped on request said so itself (rank_stopped)
    if not stopped:
        run_dir.append_event("rank_finished", rank=rank)
    if dist.is_initialized():
        if not stopped:
            # Every rank leaves together: a rank with nothing left to train (a job resumed after its last
            # checkpoint) must not close its connections while a peer still opens its process groups.
            dist.barrier()
        dist.destroy_process_group()


@record
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m pipebd_core.distill", description="one PipeBD rank (run by torchrun)"
    )
    phase_entry(DISTILL, parser, lambda run_dir, _: run_rank(run_dir), argv)


if __name__ == "__main__":
    main()
    exit_now()
