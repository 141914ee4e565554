"""Pure logic: a training phase's telemetry lines as the scalar series TensorBoard and MLflow show (a
block replicated over ranks averaged, a redone step counted once, evaluations, throughput, memory), and
those series written as event files that TensorBoard's own reader reads back."""

from __future__ import annotations

from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from pipebd_core.documents.phases import DISTILL, FINETUNE
from pipebd_core.documents.telemetry import EvalLine
from pipebd_core.rank.telemetry import TelemetryWriter
from pipebd_core.rundir import RunDir
from pipebd_core.tracking.scalars import MIB, Scalar, phase_scalars, thinned
from pipebd_core.tracking.tensorboard import write_phase
from tests.telemetry_lines import distill_line, finetune_line
from tests.unit.plan_samples import PLAN_SAMPLE


def by_tag(scalars: list[Scalar]) -> dict[str, list[tuple[int, float]]]:
    series: dict[str, list[tuple[int, float]]] = {}
    for point in scalars:
        series.setdefault(point.tag, []).append((point.step, point.value))
    return series


def test_a_block_replicated_over_ranks_is_one_series_of_their_mean() -> None:
    lines = [
        distill_line(rank, step, loss={0: 1.0 + rank + step}, time=10.0 + step, cur_mem=(rank + 1) * MIB)
        for step in range(3)
        for rank in (0, 1)
    ]
    series = by_tag(phase_scalars(DISTILL, lines, num_blocks=1))
    assert series["distill/loss/block_0"] == [(0, 1.5), (1, 2.5), (2, 3.5)]
    assert series["distill/memory_mib/rank_1"] == [(1, 2.0), (2, 2.0), (3, 2.0)]  # step: the rank's seq


def test_a_step_redone_after_a_resume_counts_once_the_later_line_standing() -> None:
    first = [distill_line(0, step, loss={0: 9.0}) for step in range(3)]
    # resumed from the checkpoint after step 0: steps 1 and 2 again, `skipped` the one done before
    again = [distill_line(0, step, loss={0: 1.0 / step}, done=step, skipped=1) for step in (1, 2)]
    series = by_tag(phase_scalars(DISTILL, first + again))
    assert series["distill/loss/block_0"] == [(0, 9.0), (1, 1.0), (2, 0.5)]


def test_blocks_trained_one_after_another_each_keep_their_own_steps_in_order() -> None:
    # layerwise: one rank trains block 0 at steps 0-1, then block 1 at steps 0-1
    lines = [
        distill_line(0, step, loss={block: float(block)}, done=2 * block + step + 1)
        for block in (0, 1)
        for step in (0, 1)
    ]
    scalars = phase_scalars(DISTILL, lines, num_blocks=2)
    series = by_tag(scalars)
    assert series["distill/loss/block_0"] == [(0, 0.0), (1, 0.0)] and series["distill/loss/block_1"] == [
        (0, 1.0),
        (1, 1.0),
    ]
    assert series["distill/memory_mib/rank_0"] == [(1, 0.0), (2, 0.0), (3, 0.0), (4, 0.0)]
    for tag, points in series.items():  # TensorBoard drops what comes after a step that went backwards
        assert [step for step, _ in points] == sorted(step for step, _ in points), tag


def test_samples_per_second_counts_each_line_by_its_share_of_the_network() -> None:
    # 2 blocks, one rank each, a batch of 8 every second for 10 seconds: 8 samples through the network per second
    lines = [
        distill_line(block, step, loss={block: 1.0}, samples=8, time=100.0 + step + 1, phases={"teacher": 1.0})
        for step in range(10)
        for block in (0, 1)
    ]
    rates = by_tag(phase_scalars(DISTILL, lines, num_blocks=2))["distill/samples_per_s"]
    assert [step for step, _ in rates] == list(range(1, 11))
    assert [rate for _, rate in rates] == pytest.approx([8.0] * 10)


def test_a_finetune_phase_has_loss_accuracy_top1_and_skips_stages_without_labels() -> None:
    lines = [
        finetune_line(0, 0, loss=2.0, acc=0.25, samples=8),
        finetune_line(1, 0, samples=None),  # a first pipeline stage: no loss, no labels
        finetune_line(0, 1, loss=1.0, acc=0.5, samples=8),
        EvalLine(time=2.0, rank=0, epoch=0, step=1, top1=0.75),
        EvalLine(time=2.5, rank=0, epoch=1, step=3, top1=None),  # no labels: no point
    ]
    series = by_tag(phase_scalars(FINETUNE, lines))
    assert series["finetune/loss"] == [(0, 2.0), (1, 1.0)] and series["finetune/train_acc"] == [(0, 0.25), (1, 0.5)]
    assert series["finetune/top1"] == [(1, 0.75)]
    assert "finetune/peak_mib/rank_1" in series and "distill/loss/block_0" not in series


def test_a_diverged_loss_is_left_out_rather_than_refused_by_the_reader() -> None:
    series = by_tag(phase_scalars(DISTILL, [distill_line(0, 0, loss={0: float("nan")})]))
    assert "distill/loss/block_0" not in series and "distill/memory_mib/rank_0" in series


def test_event_files_written_from_telemetry_read_back_through_tensorboard(tmp_path: Path) -> None:
    run_dir = RunDir(tmp_path)
    run_dir.write_json(run_dir.plan, PLAN_SAMPLE.model_copy(update={"nproc": 2, "num_blocks": 2}).to_json())
    for rank in (0, 1):
        writer = TelemetryWriter(run_dir.metrics(rank))
        for step in range(4):
            line = distill_line(rank, step, loss={rank: 1.0 / (step + 1)}, time=50.0 + step, peak_mem=(step + 1) * MIB)
            writer.write(line)
        writer.close()
    stale = run_dir.tensorboard(DISTILL) / "events.out.tfevents.0.stale"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"an earlier attempt's file")  # written anew: the phase's folder holds one file
    assert write_phase(run_dir, DISTILL) > 0
    assert not stale.exists() and len(list(run_dir.tensorboard(DISTILL).iterdir())) == 1
    events = EventAccumulator(str(run_dir.tensorboard(DISTILL)))
    events.Reload()
    tags = events.Tags()["scalars"]
    assert {"distill/loss/block_0", "distill/loss/block_1", "distill/samples_per_s", "distill/peak_mib/rank_1"} <= set(
        tags
    )
    loss = events.Scalars("distill/loss/block_1")
    assert [(event.step, event.value) for event in loss] == [(0, 1.0), (1, 0.5), (2, pytest.approx(1 / 3)), (3, 0.25)]
    assert [event.wall_time for event in loss] == [50.0, 51.0, 52.0, 53.0]
    assert [event.value for event in events.Scalars("distill/peak_mib/rank_0")] == [1.0, 2.0, 3.0, 4.0]


def test_a_long_series_is_thinned_to_bucket_means_at_their_last_step() -> None:
    scalars = [Scalar("a", step, float(step), 100.0 + step) for step in range(10)] + [Scalar("b", 0, 5.0, 1.0)]
    assert thinned(scalars, 4) == [
        Scalar("a", 2, 1.0, 102.0),  # steps 0-2
        Scalar("a", 5, 4.0, 105.0),  # steps 3-5
        Scalar("a", 7, 6.5, 107.0),
        Scalar("a", 9, 8.5, 109.0),
        Scalar("b", 0, 5.0, 1.0),  # short enough: as it was
    ]
