"""The figures' window the worker keeps as telemetry streams in (app/core/figures.FigureWindow): lines added poll
by poll leave each rank's newest RECENT_TASKS, oldest first, and give the figures pipebd_core/figures.py computes
over all the lines at once; a job's figures are its distillation's, else its fine-tuning's."""

from __future__ import annotations

from app.core.figures import FigureWindow
from app.core.tables import Job
from pipebd_core.documents.phases import DISTILL, FINETUNE
from pipebd_core.documents.telemetry import StepLine
from pipebd_core.figures import RECENT_TASKS, Figures, recent
from tests.telemetry_lines import distill_line, finetune_line

BATCH = 10


def job() -> Job:
    return Job(name="tiny", nproc=2, spec={"data": {"batch_size": BATCH}}, plan_summary={"num_blocks": 4})


def distilled(tasks: int) -> dict[int, list[StepLine]]:
    """Two ranks of a 4-block pipeline, rank 1 the slower, each task a little slower than the one before."""
    return {
        rank: [
            distill_line(rank, step, time=0.1 * step * (1 + rank), loss={2 * rank: 1.0, 2 * rank + 1: 1.0},
                         samples=BATCH, peak_mem=step, phases={"student": 0.05 * (1 + rank) + 0.001 * step})
            for step in range(tasks)
        ]
        for rank in (0, 1)
    }  # fmt: skip


def test_lines_added_poll_by_poll_keep_each_rank_s_newest_and_give_the_figures_of_all_lines() -> None:
    lines = distilled(RECENT_TASKS + 13)
    window = FigureWindow()
    interleaved = [line for pair in zip(lines[0], lines[1], strict=True) for line in pair]
    for start in range(0, len(interleaved), 7):  # uneven polls, both ranks in each, as the files are read
        window = window.add(DISTILL, interleaved[start : start + 7])
    assert window.lines[DISTILL] == recent(lines)
    assert [line.step for line in window.lines[DISTILL][1]] == list(range(13, RECENT_TASKS + 13))
    assert window.figures(job()) == Figures.of(lines, num_blocks=4, batch_size=BATCH)
    assert window.figures(job()).samples_per_s is not None


def test_a_failed_poll_leaves_the_window_as_it_was() -> None:
    before = FigureWindow().add(DISTILL, distilled(3)[0])
    after = before.add(DISTILL, distilled(5)[0][3:])
    assert [line.step for line in before.lines[DISTILL][0]] == [0, 1, 2]  # the window a failed transaction keeps
    assert [line.step for line in after.lines[DISTILL][0]] == [0, 1, 2, 3, 4]


def test_figures_are_the_distillation_s_else_the_fine_tuning_s() -> None:
    steps = [finetune_line(0, step, time=0.2 * step, elapsed=0.2, samples=BATCH) for step in range(5)]
    tuned = FigureWindow().add(FINETUNE, steps)
    assert tuned.figures(job()) == Figures.of({0: steps}, num_blocks=1, batch_size=BATCH)
    both = tuned.add(DISTILL, distilled(5)[0])
    assert both.figures(job()) == Figures.of({0: distilled(5)[0]}, num_blocks=4, batch_size=BATCH)
    assert both.figures(job()) != tuned.figures(job())
