"""`pipebd bench` on the tiny workload: the benchmark record, independent arms, one timing rule, the
measured bound, and the out-of-sample calibration of `bench --accuracy`. Tier: 2-rank gloo runs through
torchrun; ONE bench (dp and tr_dpu, one repeat, and the one-rank bound) shared by every test here."""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipebd_core.bench.accuracy import calibrated_prediction, donors, read_run
from pipebd_core.bench.arms import FROZEN_PROFILE, RECORD, WARMUP_STEPS
from pipebd_core.bench.distill import BOUND_MODE, run_bench
from pipebd_core.documents.bench_record import SHARED_CORES, BenchRecord
from pipebd_core.documents.profile import Profile
from pipebd_core.planning import profiles
from pipebd_core.planning.distill_planner import cost_model, timeline
from pipebd_core.rundir import RunDir
from tests.fake_profiles import fake_profile
from tests.helpers import tiny_spec

MODES = ["dp", "tr_dpu"]
STEPS = 8  # per block: 2 warm-up, 6 timed (enough for the monitor's calibration window, which must stay local)


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BenchRecord, Path, Path, bytes]]:
    """(record, bench folder, the profile cache's entry, its bytes before the bench)."""
    folder = tmp_path_factory.mktemp("bench")
    spec = tiny_spec(schedule={"nproc": 2, "profile": True})
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(profiles.CACHE_ENV, str(folder / "cache"))
        cached = fake_profile([0.002] * 4, [0.004] * 4, nproc=2, batch_size=10)  # never measured in the suite
        entry = profiles.store(spec, cached)
        before = entry.read_bytes()
        record = run_bench(spec, MODES, steps=STEPS, repeats=1, out=folder / "out", keep=True)
        yield record, folder / "out", entry, before


def test_the_record_holds_commit_machine_spec_and_every_run(bench: tuple[BenchRecord, Path, Path, bytes]) -> None:
    record, out, _, _ = bench
    assert BenchRecord.from_json(json.loads((out / RECORD).read_text())) == record
    assert record.commit and len(record.commit.removesuffix("+dirty")) == 40
    assert record.machine.cores >= 1 and record.machine.cpu_model and record.machine.torch
    assert record.spec["name"] == "tiny" and record.nproc == 2 and record.steps == STEPS
    assert [arm.name for arm in record.arms] == MODES
    for arm in record.arms:
        (run,) = arm.runs
        assert len(run.step_s) == STEPS - WARMUP_STEPS and all(seconds > 0 for seconds in run.step_s)
        assert run.measured_step_s == pytest.approx(statistics.fmean(run.step_s))
        assert run.predicted_step_s is not None and run.predicted_step_s > 0
        assert run.load.wall_s > 0 and run.load.other_cores >= 0
        assert run.load.shared == (run.load.other_cores > SHARED_CORES)
        assert len(run.peak_mem_bytes) == 2
    assert record.arms[0].runs[0].stages == [] and len(record.arms[1].runs[0].stages) == 2  # dp; tr_dpu's stages


def test_every_arm_planned_from_the_same_frozen_profile(bench: tuple[BenchRecord, Path, Path, bytes]) -> None:
    record, out, _, _ = bench
    frozen = Profile.from_json(json.loads((out / FROZEN_PROFILE).read_text()))
    assert frozen.digest() == record.profile_hash
    for arm in record.arms:
        assert [run.profile_hash for run in arm.runs] == [record.profile_hash]
        assert RunDir(out / f"{arm.name}-0").load_profile() == frozen


def test_no_arm_writes_calibration_another_reads(bench: tuple[BenchRecord, Path, Path, bytes]) -> None:
    record, out, entry, before = bench
    assert entry.read_bytes() == before, "an arm wrote its calibration into the profile cache"
    assert sorted(path.name for path in entry.parent.iterdir()) == [entry.name]
    for arm in record.arms:
        run_dir = RunDir(out / f"{arm.name}-0")
        assert run_dir.load_profile().calibration is None
        plan = run_dir.read_json(run_dir.plan)
        assert plan.get("replans", []) == [] and run_dir.load_spec().schedule.replan is False


def test_every_mode_is_timed_by_one_rule(bench: tuple[BenchRecord, Path, Path, bytes]) -> None:
    record, _, _, _ = bench
    timings = [run.timing for arm in record.arms for run in arm.runs] + [run.timing for run in record.bound.runs]
    assert timings == [record.timing] * len(timings)
    assert record.timing.warmup_steps == WARMUP_STEPS and record.timing.timed_steps == STEPS - WARMUP_STEPS


def test_the_bound_is_measured_on_one_rank(bench: tuple[BenchRecord, Path, Path, bytes]) -> None:
    record, out, _, _ = bench
    (run,) = record.bound.runs
    assert run.profile_hash is None and len(run.peak_mem_bytes) == 1  # one rank, planned without a profile
    assert [(s.start, s.stop, s.replicas) for s in run.stages] == [(0, 4, 1)]
    assert RunDir(out / "bound-0").load_spec().schedule.mode == BOUND_MODE
    assert record.bound.t1_s == run.measured_step_s > 0
    assert record.bound.ideal_s == pytest.approx(record.bound.t1_s / 2)
    assert record.bound.profile_ideal_s is not None and record.bound.profile_ideal_s > 0


def test_calibration_from_one_arms_run_predicts_another(bench: tuple[BenchRecord, Path, Path, bytes]) -> None:
    """The out-of-sample mechanism of `bench --accuracy` on the bench's real runs: each arm's own plan
    re-predicted from the frozen profile gives its plan phase's prediction, and with the OTHER arm's
    calibration.json it gives another figure than with its own."""
    record, out, _, _ = bench
    frozen = Profile.from_json(json.loads((out / FROZEN_PROFILE).read_text()))
    reads = {arm.name: read_run(out / f"{arm.name}-0") for arm in record.arms}
    calibrations = {name: read.calibration for name, read in reads.items()}
    assert all(calibrations.values()), "every arm's run calibrated (its calibration.json)"
    given = donors(MODES, {name for name, calibration in calibrations.items() if calibration})
    assert given == {"dp": "tr_dpu", "tr_dpu": "dp"}
    spec = RunDir(out / "tr_dpu-0").load_spec()
    for arm in record.arms:
        plan, donor = reads[arm.name].plan, given[arm.name]
        assert timeline(plan, cost_model(spec, frozen)).step_s == pytest.approx(arm.runs[0].predicted_step_s)
        own, other = calibrations[arm.name], calibrations[donor or ""]
        assert own is not None and other is not None and own.source.run == f"{arm.name}-0" != other.source.run
        out_of_sample = calibrated_prediction(plan, spec, frozen, other)
        assert out_of_sample != calibrated_prediction(plan, spec, frozen, own)
        assert out_of_sample != arm.runs[0].predicted_step_s
