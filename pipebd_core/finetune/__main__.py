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


def preload(run_dir: RunDir) -> list[str]:
    """What this run's finetune ranks import beyond this module, for a warm agent to import once before it
    forks them (job/warm_torchrun.py): a pipeline strategy's stages; a DDP rank needs none of it. A plan that
    cannot be read is left for the ranks to report."""
    try:
        pipelined = TrainPlan.from_document(run_dir.load_finetune_plan()).pipelined
    except Exception:
        return []
    if not pipelined:
        return []
    importlib.import_module(PIPELINE)
    return [PIPELINE]


@record
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m pipebd_core.finetune", description="one finetune rank")
    phase_entry(FINETUNE, parser, lambda run_dir, _: run_rank(run_dir), argv)


if __name__ == "__main__":
    main()
    exit_now()
