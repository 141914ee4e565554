"""A phase module for tests/ranks/test_forked.py: `python -m tests.forked_probe OUT [--code N] [--crash]
[--wait PATH] [--run-dir DIR] [--child]` writes what it sees of its process to OUT (JSON), prints a line to stdout
and one to stderr, waits for PATH to exist if asked, then exits with N, or raises."""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, TypeVar

import torch

Started = TypeVar("Started")


def start_probe(
    start: Callable[[list[str], dict[str, str], IO[bytes]], Started | None],
    folder: Path,
    *args: str,
    env: dict[str, str] | None = None,
) -> tuple[Started, Path]:
    """Start this probe (writing what it sees to `folder`/seen.json, its output to `folder`/launcher.log)
    with `start` (forked.start or agent_server.start), which must start it."""
    folder.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "tests.forked_probe", str(folder / "seen.json"), *args]
    log = folder / "launcher.log"
    with log.open("ab") as stream:
        process = start(command, env if env is not None else {"OMP_NUM_THREADS": "1"}, stream)
    assert process is not None, f"{start.__module__}.start declined the probe: it must start it"
    return process, log


def seen(folder: Path) -> dict[str, object]:
    """What the probe started in `folder` saw of its process."""
    loaded: dict[str, object] = json.loads((folder / "seen.json").read_text())
    return loaded


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.forked_probe")
    parser.add_argument("out", type=Path)
    parser.add_argument("--code", type=int, default=0)
    parser.add_argument("--crash", action="store_true")
    parser.add_argument("--wait", type=Path)
    parser.add_argument("--run-dir")
    parser.add_argument("--child", action="store_true", help="exit with the code of a multiprocessing child's")
    args = parser.parse_args(argv)
    seen = {
        "pid": os.getpid(),
        "sid": os.getsid(0),
        "argv": sys.argv,
        "environ": dict(os.environ),
        "threads": torch.get_num_threads(),
        "path0": sys.path[0],
        "imported": sorted(name for name in sys.modules if name.partition(".")[0] in ("torchvision", "tests")),
    }
    args.out.write_text(json.dumps(seen))
    print("probe: to stdout", flush=True)
    print("probe: to stderr", file=sys.stderr, flush=True)
    while args.wait is not None and not args.wait.exists():
        time.sleep(0.05)
    if args.child:  # as torchrun's agent forks its ranks, which end through multiprocessing's own exit
        child = multiprocessing.get_context("fork").Process(target=print, args=("probe: the child ran",))
        child.start()
        child.join()
        raise SystemExit(child.exitcode)
    if args.crash:
        raise RuntimeError("the probe crashed on purpose")
    raise SystemExit(args.code)


if __name__ == "__main__":
    main()
