"""How long the exact planner takes: 20 blocks on 8 devices (the target is under a second).

Run: .venv/bin/python benchmarks/planner_speed.py
Prints the median of several timed searches, and how many plans the search ranked exactly.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipebd_core.planning.distill_costmodel import CostModel
from pipebd_core.planning.distill_search import search
from tests.fake_profiles import fake_profile


def main() -> None:
    teacher = [1.0 + (i % 5) * 0.7 for i in range(20)]
    student = [0.5 + (i % 3) * 0.4 for i in range(20)]
    model = CostModel(fake_profile(teacher, student, nproc=8, batch_size=64, p2p=0.05, allreduce=0.1, data=0.1))
    timings = []
    for _ in range(5):
        started = time.perf_counter()
        result = search(model)
        timings.append(time.perf_counter() - started)
    best = result.plans[0]
    print(f"20 blocks on 8 devices: {result.considered} plans ranked exactly in {statistics.median(timings):.3f} s")
    print(f"  (median of 5; min {min(timings):.3f} s, max {max(timings):.3f} s); best step {best.step_s:.3f}")


if __name__ == "__main__":
    main()
