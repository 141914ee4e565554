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

The ranks are not forked from the agent itself but from a fork server the agent forks first
(`start_rank_server`: multiprocessing's own, with the agent's imports), while the agent still has one
thread: by the time its ranks start, the agent runs the rendezvous store's thread and torch's keep-alive
timer, and a child forked from a process with threads inherits whatever lock another thread held at that
instant, held forever. (A rank forked from the agent itself that never joined its group, its peers
waiting for its address, was seen under a loaded test suite: tests/ranks/test_rank_server.py.) A rank
gets the defaults of a fresh interpreter back (the agent's signal handlers are not its own) and calls the
module's `main(argv)`. Forking is safe while the agent has not touched CUDA, which it never needs to;
should CUDA be initialised anyway, the ranks are spawned instead (a fresh interpreter, as plain torchrun
does).
"""

from __future__ import annotations

import importlib
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import multiprocessing.util
import os
import signal
import socket
import sys
import threading
import traceback
import uuid
from pathlib import Path
from typing import Any

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


def start_rank_server() -> None:
    """Fork multiprocessing's fork server from this process, which must have one thread, and make it the one
    this process's "forkserver" context starts its children from: they are forked from a copy of this
    process as it is now, its imports done, instead of from a fresh interpreter that imports them again
    (what multiprocessing would start). Its socket is in the abstract namespace (no file to leave behind);
    it ends when the last process holding its "alive" pipe (this one and the ranks) has ended.
    Multiprocessing's resource tracker, which that context needs too, is forked likewise (start_tracker)."""
    if threading.active_count() != 1:
        raise RuntimeError(f"the rank server must be forked before any thread starts: {threading.enumerate()}")
    start_tracker()
    address = f"\0pipebd-ranks-{os.getpid()}-{uuid.uuid4().hex}"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(address)
    listener.listen()
    alive_r, alive_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the server: serves until no process holds the alive pipe's other end
        code = 0
        try:
            os.close(alive_w)
            multiprocessing.forkserver.main(listener.fileno(), alive_r, preload=[])
        except SystemExit:
            pass
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            os._exit(code)
    os.close(alive_r)
    listener.close()
    server: Any = multiprocessing.forkserver._forkserver  # its private state: what its ensure_running sets
    server._forkserver_address, server._forkserver_alive_fd, server._forkserver_pid = address, alive_w, pid


def start_tracker() -> None:
    """Fork multiprocessing's resource tracker (which unlinks the named semaphores of the ranks' queues should
    their owners die) from this process, instead of the fresh interpreter multiprocessing would start for it:
    0.1 s of CPU an agent, 176 of them in a test suite. It ends when the last holder of its pipe (this
    process, the rank server and the ranks) has ended."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(write)
            multiprocessing.resource_tracker.main(read)
        finally:
            os._exit(0)
    os.close(read)
    tracker: Any = multiprocessing.resource_tracker._resource_tracker  # its private state: what it sets itself
    tracker._fd, tracker._pid = write, pid


def stop_rank_server() -> None:
    """After the ranks: unlink the semaphores of this process's queues (an exit that skips the interpreter's
    teardown would leave multiprocessing's resource tracker to, and to warn of), then close the rank
    server's alive pipe and the tracker's and reap both, so that the CPU of the server and of the ranks it
    reaped is counted as this agent's children's (what its supervisor and any `time` read), not left to init."""
    multiprocessing.util._run_finalizers(0)  # type: ignore[attr-defined]
    multiprocessing.forkserver._forkserver._stop()  # type: ignore[attr-defined]
    multiprocessing.resource_tracker._resource_tracker._stop()  # type: ignore[attr-defined]


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
    if torch.cuda.is_initialized():
        config.start_method = "spawn"
    else:
        start_rank_server()
        config.start_method = "forkserver"
    elastic_launch(config, entrypoint=run_rank)(args.training_script, rank_args)
    stop_rank_server()
    exit_now()  # the ranks succeeded; the agent holds no file of its own


if __name__ == "__main__":
    main()
