"""Rank entry point of the `finetune` phase: `torchrun --standalone --nproc-per-node N -m pipebd_core.finetune`."""

from __future__ import annotations

import argparse
import importlib

from torch.distributed.elastic.multiprocessing.errors import record

from pipebd_core.documents.phases import FINETUNE
from pipebd_core.finetune.plan import TrainPlan
from pipebd_core.finetune.rank import run_rank
from pipebd_core.rank.process import exit_now, phase_entry
from pipebd_core.rundir import RunDir

PIPELINE = "pipebd_core.finetune.pipeline"  # a pipeline's stages and schedules: torch.distributed.pipelining
DYNAMO = "torch._dynamo"  # what DistributedDataParallel's constructor imports (1.3 s of CPU)


def preload(run_dir: RunDir) -> list[str]:
    """What this run's finetune ranks import beyond this module, for a warm agent to import once before it
    forks them (job/warm_torchrun.py): a pipeline strategy's stages, or for DDP over several ranks what
    DDP imports; a single DDP rank (no DDP wrapper) needs neither. A plan that cannot be read is left for
    the ranks to report."""
    try:
        plan = TrainPlan.from_document(run_dir.load_finetune_plan())
    except Exception:
        return []
    wanted = PIPELINE if plan.pipelined else DYNAMO if plan.nproc > 1 else None
    if wanted is None:
        return []
    importlib.import_module(wanted)
    return [wanted]


@record
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m pipebd_core.finetune", description="one finetune rank")
    phase_entry(FINETUNE, parser, lambda run_dir, _: run_rank(run_dir), argv)


if __name__ == "__main__":
    main()
    exit_now()
