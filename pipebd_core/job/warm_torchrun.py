"""torchrun with warm ranks: `python -m pipebd_core.job.warm_torchrun [torchrun options] -m MODULE ARGS`.

The same command line as `torchrun` and the same elastic agent (`torch.distributed.launcher`, a c10d
rendezvous, `--max-restarts`, exit codes and error files), with one difference: the agent imports the
rank module once, with what the run's workload and data set import (`rank.process.preload`: torchvision
for a VGG or MobileNetV2 teacher, transformers for a decoder) and what the module's own `preload(run_dir)`
names, if it has one (the finetune rank: torch.distributed.pipelining for a pipeline strategy), and, for
several ranks, torch's dynamo, which torch imports when a rank builds its optimiser; and forks its ranks from itself,
instead of starting one fresh interpreter per rank that imports torch again. A rank then starts in
milliseconds rather than the 2-3 s of CPU that importing torch (and torchvision) costs each; that is
most of a short phase on a CPU node and of a relaunch when a job re-plans.

A forked rank gets the defaults of a fresh interpreter back (the agent's signal handlers are not its
own) and calls the module's `main(argv)`. Forking is safe while the agent has not touched CUDA, which
it never needs to; should CUDA be initialised anyway, the ranks are spawned instead (a fresh
interpreter, as plain torchrun does).
"""

from __future__ import annotations

import importlib
import signal
import sys
import traceback
import uuid
from pathlib import Path

import torch
from torch.distributed.elastic.multiprocessing.errors import record
from torch.distributed.launcher.api import elastic_launch
from torch.distributed.run import config_from_args, parse_args

from pipebd_core.job.forked import every_rank_imports, rank_module
from pipebd_core.rank.process import exit_now, preload
from pipebd_core.rundir import RunDir

# What torch's agent handles itself and a rank must not inherit: (signal, a fresh interpreter's handler).
FRESH_HANDLERS = (
    (signal.SIGTERM, signal.SIG_DFL),
    (signal.SIGINT, signal.default_int_handler),
    (signal.SIGHUP, signal.SIG_DFL),
    (signal.SIGQUIT, signal.SIG_DFL),
)


def for_every_rank(nproc: int) -> list[str]:
    """What every rank imports whatever it runs (forked.every_rank_imports), imported here once."""
    names = every_rank_imports(nproc)
    for name in names:
        importlib.import_module(name)
    return names


def run_rank(name: str, argv: list[str]) -> None:
    """One rank: a fresh interpreter's signal handlers, then the module's `main(argv)`; an exception's
    traceback goes to the rank's stderr (its log), as a fresh interpreter would print it on exit."""
    for signum, handler in FRESH_HANDLERS:
        signal.signal(signum, handler)
    try:
        rank_module(name).main(argv)
    except (Exception, KeyboardInterrupt):  # not SystemExit: an exit is not a crash
        traceback.print_exc()
        sys.stderr.flush()
        raise


@record
def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if not args.module:
        raise SystemExit("warm_torchrun: run a module with -m MODULE (a script path is not supported)")
    if args.standalone:  # as torchrun does: a c10d store on a free local port
        args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id = "c10d", "localhost:0", str(uuid.uuid4())
    if args.master_port is None:  # torchrun's default, used by the static rendezvous only
        args.master_port = 29500
    config, _, _ = config_from_args(args)
    module = rank_module(args.training_script)  # warm: imported once, before the ranks fork
    rank_args = list(args.training_script_args)
    if "--run-dir" in rank_args[:-1]:  # and what the run's workload and data set import
        run_dir = RunDir(Path(rank_args[rank_args.index("--run-dir") + 1]))
        preload(run_dir)
        if hasattr(module, "preload"):  # what the module's ranks import for this run (a pipeline's stages)
            module.preload(run_dir)
    for_every_rank(config.nproc_per_node)  # and what every rank imports, once
    config.start_method = "spawn" if torch.cuda.is_initialized() else "fork"
    elastic_launch(config, entrypoint=run_rank)(args.training_script, rank_args)
    exit_now()  # the ranks succeeded; the agent holds no file of its own


if __name__ == "__main__":
    main()
