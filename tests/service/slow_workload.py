"""A custom workload whose blocks take a while to build (sleeping, not computing): a job's preparation, which
builds its workload, lasts longer than a short stale bound of the reaper."""

from __future__ import annotations

import time

from torch import nn

from pipebd_core.workloads.tiny import make_blocks

FACTORY = "tests.service.slow_workload:make_slow_blocks"


def make_slow_blocks(build_s: float = 2.0) -> tuple[list[nn.Module], list[nn.Module]]:
    time.sleep(build_s)
    return make_blocks()
