"""Run a step that builds a network or loads a data set in a child process, so that the process that
supervises jobs (a Celery worker, `pipebd run`) never imports torchvision or transformers and never holds
the memory of a network: the launch's preflight, the `plan` phase and the `plan_finetune` phase.

The child is forked: torch is already imported here, and a fresh interpreter would spend 3-4 s of CPU
importing it again before every plan. Where CUDA is initialised in this process (forking it is unsafe)
the child is spawned instead, as `job/warm_torchrun.py` does for ranks. The step's exception is raised
here as the same type with the same message (a SpecError stays a SpecError); a child that dies without
one (killed, out of memory) raises `StepDied` with its exit code.
"""

from __future__ import annotations

import multiprocessing
import pickle
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.context import ForkContext, SpawnContext
from typing import Any

import torch


class StepDied(RuntimeError):
    """The child running a step ended without an answer."""


def _run(step: Callable[..., None], args: tuple[Any, ...], answer: Connection) -> None:
    """The child: run `step`, then send None or the exception it raised."""
    try:
        step(*args)
    except BaseException as error:  # every failure goes back to the parent, which raises it
        try:
            answer.send_bytes(pickle.dumps(error))
        except Exception:  # an exception that does not pickle: its type and message
            answer.send_bytes(pickle.dumps(RuntimeError(f"{type(error).__name__}: {error}")))
        return
    answer.send_bytes(pickle.dumps(None))


def in_child(step: Callable[..., None], *args: Any) -> None:
    """Run `step(*args)` in a child process and wait for it; raise what it raised."""
    context: ForkContext | SpawnContext = (
        multiprocessing.get_context("spawn") if torch.cuda.is_initialized() else multiprocessing.get_context("fork")
    )
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_run, args=(step, args, send), name=f"pipebd-{step.__name__}")
    child.start()
    send.close()  # the child holds the only writer: a child that dies closes it and recv sees EOF
    try:
        error = pickle.loads(receive.recv_bytes())
    except EOFError:
        child.join()
        raise StepDied(f"{step.__name__} ended with exit code {child.exitcode} and no answer") from None
    finally:
        receive.close()
    child.join()
    if error is not None:
        raise error
