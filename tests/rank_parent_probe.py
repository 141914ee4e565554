"""A rank module for tests/ranks/test_rank_server.py: `python -m pipebd_core.job.warm_torchrun --standalone
--nproc-per-node N -m tests.rank_parent_probe OUT` joins a gloo group of N ranks, sums their ranks, and writes
OUT/rank-R.json: its parent and grandparent, how many threads each had while the group was joined, and the
command lines of the grandparent's children."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist


def parent_of(pid: int) -> int:
    """The parent pid of `pid`, from /proc (the field after the command's closing parenthesis)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


def threads_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def children_commands(pid: int) -> list[str]:
    """The command lines of `pid`'s children (a forked child's is its parent's)."""
    commands = []
    for task in os.listdir(f"/proc/{pid}/task"):
        for child in Path(f"/proc/{pid}/task/{task}/children").read_text().split():
            commands.append(Path(f"/proc/{child}/cmdline").read_text().replace("\0", " "))
    return commands


def main(argv: list[str]) -> None:
    out = Path(argv[0])
    dist.init_process_group("gloo")
    total = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(total)
    parent = os.getppid()
    grandparent = parent_of(parent)
    seen = {
        "rank": dist.get_rank(),
        "sum": total.item(),
        "parent": parent,
        "parent_threads": threads_of(parent),
        "grandparent": grandparent,
        "grandparent_threads": threads_of(grandparent),
        "agent_children": children_commands(grandparent),
    }
    dist.barrier()  # every rank has read its parents' threads while the agent's store still serves
    dist.destroy_process_group()
    (out / f"rank-{seen['rank']}.json").write_text(json.dumps(seen))
    sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
