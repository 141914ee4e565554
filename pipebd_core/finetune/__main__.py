"""Rank entry point of the `finetune` phase: `torchrun --standalone --nproc-per-node N -m pipebd_core.finetune`."""

from __future__ import annotations

import argparse

from torch.distributed.elastic.multiprocessing.errors import record

from pipebd_core.documents.phases import FINETUNE
from pipebd_core.finetune.rank import run_rank
from pipebd_core.rank.process import exit_now, phase_entry


@record
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m pipebd_core.finetune", description="one finetune rank")
    phase_entry(FINETUNE, parser, lambda run_dir, _: run_rank(run_dir), argv)


if __name__ == "__main__":
    main()
    exit_now()
