"""Benchmark records and their report: the benchmarks page's tables regenerated from a committed record,
byte for byte; the one timing rule every mode is measured by; overlapping intervals never ranked."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from pipebd_core.bench.arms import epoch_starts, timed_step_s, timing_rule
from pipebd_core.bench.progress import read_record
from pipebd_core.bench.report import describe, fastest_line, load_record, render, versus
from pipebd_core.documents.bench_record import SLOWEST_RANK, SLOWEST_STEP, Arm, BenchRecord
from tests.helpers import pipebd_here
from tests.telemetry_lines import distill_line, finetune_line

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "bench"
RECORD, EXPECTED = FIXTURES / "record.json", FIXTURES / "report.md"
# a real end-to-end training bench of the tiny network (ddp, zb and the bound; measured on a shared machine)
FINETUNE_RECORD, FINETUNE_EXPECTED = FIXTURES / "finetune-record.json", FIXTURES / "finetune-report.md"


@pytest.mark.parametrize(("record", "expected"), [(RECORD, EXPECTED), (FINETUNE_RECORD, FINETUNE_EXPECTED)])
def test_the_report_is_regenerated_from_its_record_byte_for_byte(record: Path, expected: Path) -> None:
    assert render([load_record(record)]) == expected.read_text()


def test_end_to_end_training_is_compared_with_ddp_and_shows_each_ranks_bubble() -> None:
    text = FINETUNE_EXPECTED.read_text()
    assert "| vs ddp |" in text and "| bubble per rank |" in text and "zb: 0-3 x1 \\| 4-10 x1" in text
    assert "every teacher and student block" not in text and "the whole network, the full batch" in text


def test_pipebd_bench_report_prints_it() -> None:
    code, out, err = pipebd_here("bench", "--report", str(RECORD), str(RECORD))
    assert code == 0, err
    assert out == EXPECTED.read_text() + "\n" + EXPECTED.read_text()  # one section per record, in order


def test_a_file_that_is_not_a_record_is_refused_naming_it(tmp_path: Path) -> None:
    wrong = tmp_path / "plan.json"
    wrong.write_text(json.dumps({"format_version": 1, "mode": "dp"}))
    code, _, err = pipebd_here("bench", "--report", str(wrong))
    assert code == 2 and f"--report {wrong}: not a benchmark record" in err
    code, _, err = pipebd_here("bench", "examples/tiny-custom.yaml", "--report", str(RECORD))
    assert code == 2 and "give record files, not a spec" in err


def test_shared_arms_and_overlapping_intervals_are_said_in_their_rows() -> None:
    rows = {line.split(" | ")[0].lstrip("| "): line for line in EXPECTED.read_text().splitlines() if "|" in line}
    assert "0.41 shared" in rows["tr_dpu **shared**"] and "shared" not in rows["dp"]
    assert "overlaps dp" in rows["ls"] and "2.05x" in rows["tr_dpu **shared**"]


def test_a_comparison_is_ranked_only_when_the_intervals_are_apart() -> None:
    record = BenchRecord.from_json(json.loads(RECORD.read_text()))
    dp = next(arm for arm in record.arms if arm.name == "dp")

    def scaled(factor: float) -> Arm:
        runs = [run.model_copy(update={"measured_step_s": factor * run.measured_step_s}) for run in dp.runs]
        return Arm(name="tr", runs=runs)

    close, apart = scaled(0.95), scaled(0.5)
    assert versus(close, dp) == "overlaps dp"  # 0.039 to 0.043 against 0.041 to 0.045
    assert versus(apart, dp) == "2.00x (2.00-2.00)"  # with its range over the repeats


def test_arms_that_ran_the_same_schedule_are_never_ranked() -> None:
    record = BenchRecord.from_json(json.loads(RECORD.read_text()))
    pipelined = next(arm for arm in record.arms if arm.runs[0].stages)
    faster = [run.model_copy(update={"measured_step_s": 0.5 * run.measured_step_s}) for run in pipelined.runs]
    auto = Arm(name="auto", runs=faster)  # the same stages, measured twice as fast: still the same plan
    said = f"Fastest: not ranked; auto ran the same schedule as {pipelined.name}, so the difference between"
    assert fastest_line([pipelined, auto]) == said + " them is noise."
    barrier = Arm(name="tr", runs=pipelined.runs)  # tr's barrier makes the same stages another schedule
    assert fastest_line([barrier, auto]) == "Fastest: auto, its interval clear of every other arm's."


def test_every_mode_is_timed_by_one_rule() -> None:
    """dp (one rank, block 1 after block 0) and a two-stage pipeline: each step after the warm-up is the time
    since the rank's previous task, summed over the step's tasks; the slowest rank's."""
    dp = [
        [distill_line(step=s, time=1.0 + s, loss={0: 1.0}) for s in range(4)]
        + [distill_line(step=s, time=6.0 + 2 * s, loss={1: 1.0}) for s in range(4)]
    ]
    assert timed_step_s(dp, warmup=2) == {2: 3.0, 3: 3.0}  # block 0's second and block 1's, never the gap
    pipeline = [
        [distill_line(rank=0, step=s, time=1.0 + s) for s in range(4)],
        [distill_line(rank=1, step=s, time=2.0 + 1.5 * s) for s in range(4)],
    ]
    assert timed_step_s(pipeline, warmup=2) == {2: 1.5, 3: 1.5}
    first = [[distill_line(step=0, time=10.0, phases={"teacher": 0.25, "student": 0.5})]]
    assert timed_step_s(first, warmup=0) == {0: pytest.approx(0.75)}  # a rank's first task: from its own start


def test_a_run_is_timed_at_its_slowest_ranks_pace_not_each_steps_slowest() -> None:
    """A decoupled pipeline whose ranks alternate 1 s and 3 s steps out of phase: both keep a pace of 2 s a
    step, which the run's steps are (each step's slowest rank would say 3 s)."""
    out_of_phase = [
        [distill_line(rank=0, step=s, time=float(sum(1 if i % 2 else 3 for i in range(s + 1)))) for s in range(6)],
        [distill_line(rank=1, step=s, time=float(sum(3 if i % 2 else 1 for i in range(s + 1)))) for s in range(6)],
    ]
    steps = timed_step_s(out_of_phase, warmup=2)
    assert statistics.fmean(steps.values()) == 2.0
    assert steps == {2: 3.0, 3: 1.0, 4: 3.0, 5: 1.0}  # one rank's own steps, in order
    slower = [out_of_phase[0], [line.model_copy(update={"time": 2 * line.time}) for line in out_of_phase[1]]]
    assert statistics.fmean(timed_step_s(slower, warmup=2).values()) == 4.0  # the slower rank's pace


def test_a_record_timed_by_the_earlier_rule_says_so_and_is_not_resumed(tmp_path: Path) -> None:
    record = BenchRecord.from_json(json.loads(RECORD.read_text()))
    assert record.timing.pace == SLOWEST_STEP  # committed before the pace: the field is absent
    assert "the earlier rule, which overstates decoupled pipelines" in describe(record)
    unfinished = record.model_copy(update={"runs_left": ["dp-9"]})
    (tmp_path / "bench.json").write_text(unfinished.model_dump_json())
    with pytest.raises(ValueError, match="timed by an earlier rule"):
        read_record(tmp_path / "bench.json")
    paced = unfinished.model_copy(update={"timing": timing_rule(2, 4)})
    (tmp_path / "bench.json").write_text(paced.model_dump_json())
    assert read_record(tmp_path / "bench.json").timing.pace == SLOWEST_RANK
    assert "each run's steps its slowest rank's" in describe(paced)


def test_an_epochs_first_step_is_not_timed() -> None:
    """Epochs of 4 steps: step 4's line comes 1.5 s after step 3's (the checkpoint and evaluation between
    them); left out, every step timed is 0.5 s."""
    times = [1.0, 1.5, 2.0, 2.5, 4.0, 4.5, 5.0, 5.5]
    lines = [[finetune_line(step=s, time=t, elapsed=0.5) for s, t in enumerate(times)]]
    assert epoch_starts(per_epoch=4, steps=8) == [4]
    assert timed_step_s(lines, warmup=2) == {2: 0.5, 3: 0.5, 4: 1.5, 5: 0.5, 6: 0.5, 7: 0.5}
    assert timed_step_s(lines, warmup=2, left_out=epoch_starts(4, 8)) == {2: 0.5, 3: 0.5, 5: 0.5, 6: 0.5, 7: 0.5}
