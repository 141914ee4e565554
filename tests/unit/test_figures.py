"""The figures' one definition (pipebd_core/figures.py) on exact small inputs: samples/s over each rank's
window, the measured step, busy share, peak memory, the spread of a job's pace and a speed-up within noise."""

from __future__ import annotations

import itertools
import math
import statistics

import pytest

from pipebd_core.documents.telemetry import DistillLine
from pipebd_core.figures import (
    RECENT_TASKS,
    Figures,
    busy_share,
    peak_mem,
    rank_load,
    samples_per_s,
    speedup,
    spread,
    step_s,
)
from pipebd_core.job.progress import PhaseSize, Progress
from tests.telemetry_lines import distill_line, finetune_line


def task(rank: int, step: int, end: float, blocks: list[int], **phases: float) -> DistillLine:
    return distill_line(rank, step, time=end, loss=dict.fromkeys(blocks, 1.0), phases=phases, samples=8, peak_mem=step)


def test_samples_per_s_counts_each_rank_s_share_of_the_network_over_its_window() -> None:
    # rank 0 trains blocks 0-1 of 4 in 0.5 s tasks, back to back: 8 x 2/4 samples per 0.5 s = 8 samples/s;
    # rank 1 trains blocks 2-3 in 0.25 s tasks ending at the same times: 6 x 4 samples from 0.25 s to 3.0 s
    lines = {
        0: [task(0, s, 0.5 * (s + 1), [0, 1], teacher=0.2, student=0.3) for s in range(6)],
        1: [task(1, s, 0.5 * (s + 1), [2, 3], student=0.25) for s in range(6)],
    }
    assert samples_per_s(lines, num_blocks=4) == pytest.approx(8.0 + 24 / 2.75)
    assert step_s(batch_size=8, speed=16.0) == pytest.approx(0.5)
    assert step_s(8, None) is None and samples_per_s({}, 4) is None
    # rank 1: its first task started at 0.25; its window 0.25-3.0 s, busy 6 x 0.25 s of it
    assert rank_load(1, lines[1]).busy_share == pytest.approx(1.5 / 2.75)  # type: ignore[union-attr]
    assert busy_share(lines) == pytest.approx(1.0)  # the busiest rank's: rank 0 never waits
    assert peak_mem(lines) == 5


def test_the_window_leaves_out_a_slow_start() -> None:
    # a 100 s first task (loading, compiling) then RECENT_TASKS tasks of 1 s: the start is outside the window
    slow = [task(0, 0, 100.0, [0], teacher=100.0)]
    steady = [task(0, s, 100.0 + s, [0], teacher=1.0) for s in range(1, RECENT_TASKS + 1)]
    assert samples_per_s({0: slow + steady}, num_blocks=1) == pytest.approx(8.0)


def test_waits_are_not_busy_and_fine_tuning_lines_count_the_whole_network() -> None:
    waiting = {0: [task(0, s, s + 1.0, [0], recv_wait=0.75, student=0.25) for s in range(4)]}
    assert busy_share(waiting) == pytest.approx(0.25)
    tuned = {0: [finetune_line(0, s, time=0.5 * (s + 1), elapsed=0.5, samples=10, peak_mem=7) for s in range(4)]}
    figures = Figures.of(tuned, num_blocks=4, batch_size=10)
    assert figures.samples_per_s == pytest.approx(20.0) and figures.step_s == pytest.approx(0.5)
    assert figures.busy_share is None and figures.peak_mem == 7  # no timed waits: no busy share


def test_spread_measures_the_pace_s_variation_and_a_speed_up_inside_it_is_noise() -> None:
    even = {0: [task(0, s, float(s + 1), [0], teacher=1.0) for s in range(10)]}
    assert spread(even) == pytest.approx(0.0)
    # tasks ending 1 s and 2 s apart in turn: the spread is the deviation of the log intervals
    ends = [1.0, 3.0, 4.0, 6.0, 7.0, 9.0, 10.0, 12.0, 13.0, 15.0]
    uneven = {0: [task(0, s, end, [0], teacher=0.5) for s, end in enumerate(ends)]}
    expected = statistics.stdev([math.log(later - earlier) for earlier, later in itertools.pairwise(ends)])
    assert expected == pytest.approx(math.log(2) * math.sqrt(5 / 18))
    assert spread(uneven) == pytest.approx(expected)
    assert spread({0: even[0][:3]}) is None  # two intervals: not enough to say
    assert speedup(110.0, expected, 100.0, expected).within_noise  # 10% apart, steps about 37% apart
    assert speedup(110.0, expected, 100.0, expected).text() == "within noise"
    fast = speedup(400.0, 0.01, 100.0, 0.02)
    assert not fast.within_noise and fast.text() == "\u00d74.00"
    assert not speedup(101.0, None, 100.0, None).within_noise  # no spread known: any difference shows


def test_pipebd_run_s_progress_line_uses_the_same_definition() -> None:
    progress = Progress(PhaseSize(nproc=1, total_steps=100, batch_size=8, num_blocks=2))
    before = progress.describe()  # before the first step: no loss and no rate yet, and no "nan"
    assert "— samples/s" in before and "mean block loss — |" in before and "nan" not in before
    lines = [task(0, s, 0.5 * (s + 1), [0], teacher=0.5) for s in range(RECENT_TASKS + 5)]
    for line in lines:
        progress.add(line)
    assert progress.samples_per_s() == pytest.approx(samples_per_s({0: lines}, 2)) == pytest.approx(8.0)
    assert len(progress.recent[0]) == RECENT_TASKS
