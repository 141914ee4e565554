"""Pure logic: following a phase's telemetry files reads typed lines, counts progress from them, and passes
over a line an earlier PipeBD wrote (saying so once) rather than ending the job that follows it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipebd_core.documents.phases import FINETUNE
from pipebd_core.documents.telemetry import EvalLine
from pipebd_core.job.progress import MetricsFollower
from pipebd_core.rank.telemetry import TelemetryWriter
from pipebd_core.rundir import RunDir
from tests.telemetry_lines import distill_line, finetune_line
from tests.unit.plan_samples import FINETUNE_SAMPLE, PLAN_SAMPLE


def planned(tmp_path: Path, name: str) -> RunDir:
    """A run directory whose plan (`plan` or `finetune_plan`) has 2 ranks, 4 steps and a batch of 8."""
    run_dir = RunDir(tmp_path)
    sample = PLAN_SAMPLE if name == "plan" else FINETUNE_SAMPLE
    steps = sample.steps.model_copy(update={"total_steps": 4})
    document = sample.model_copy(update={"nproc": 2, "batch_size": 8, "steps": steps})
    run_dir.write_json(getattr(run_dir, name), document.to_json())
    return run_dir


def test_a_follower_reads_typed_lines_and_counts_the_phase_done(tmp_path: Path) -> None:
    run_dir = planned(tmp_path, "plan")
    follower = MetricsFollower(run_dir)
    for rank in (0, 1):
        writer = TelemetryWriter(run_dir.metrics(rank))
        for step in range(2):
            writer.write(distill_line(rank, step, loss={rank: 1.0 / (step + 1)}, total=4))
        writer.close()
    lines = follower.poll()
    assert [(line.rank, line.step) for line in lines] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert follower.progress.fraction == pytest.approx(0.5) and follower.progress.losses == {"0": 0.5, "1": 0.5}
    assert follower.refused is None and follower.poll() == []  # nothing new


def test_a_finetune_follower_keeps_evaluations_out_of_progress(tmp_path: Path) -> None:
    run_dir = planned(tmp_path, "finetune_plan")
    follower = MetricsFollower(run_dir, FINETUNE)
    writer = TelemetryWriter(run_dir.metrics(0, FINETUNE))
    writer.write(finetune_line(0, 0, loss=2.0, total=4))
    writer.write(EvalLine(time=1.0, rank=0, epoch=1, step=0, top1=0.5))
    writer.close()
    step, evaluation = follower.poll()
    assert isinstance(evaluation, EvalLine) and evaluation.top1 == 0.5 and step.step == 0
    assert follower.progress.losses == {"network": 2.0} and follower.progress.latest == {0: step}


def test_lines_of_an_earlier_pipebd_are_passed_over_and_named_once(tmp_path: Path) -> None:
    run_dir = planned(tmp_path, "plan")
    follower = MetricsFollower(run_dir)
    old = {"time": 1.0, "rank": 0, "epoch": 0, "step": 0, "blocks": [0], "loss": {"0": 1.0}, "done": 1, "total": 4}
    run_dir.metrics(0).parent.mkdir(parents=True)
    run_dir.metrics(0).write_text(json.dumps(old) + "\n" + json.dumps(distill_line(0, 1, total=4).to_json()) + "\n")
    assert [line.step for line in follower.poll()] == [1]
    assert follower.refused is not None and "written without a format version" in follower.refused
